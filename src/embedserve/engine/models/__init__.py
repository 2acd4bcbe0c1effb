"""Model definitions written for packed ragged batches."""
