"""`embedserve index`: a corpus embedded on a Ray Data actor pool into Parquet."""
