"""Generated protobuf modules (scripts/gen_proto.sh) and their source .proto."""
