#!/bin/sh
# Regenerate the gRPC modules from the .proto (needs grpcio-tools); run from the repository root.
cd src && python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. embedserve/server/proto/embedserve.proto
