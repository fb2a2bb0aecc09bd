"""Code generated from proto/api.proto by proto/generate.sh. Do not edit."""
