"""The gRPC server layer: scheduling batches for one engine. Importing this package imports nothing."""
