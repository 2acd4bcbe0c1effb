#!/bin/sh
# Regenerate the gRPC modules of the gateway<->server contract from its .proto (needs
# grpcio-tools); run from the repository root.
set -e
cd src && python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. embedserve/contract/embedserve.proto
python -m grpc_tools.protoc -I. --python_out=. embedserve/contract/otlp_trace.proto
python ../scripts/tei_descriptor.py
