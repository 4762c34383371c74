"""Message types, codec, schema versions and topic names shared by every role.

This package imports no torch, vLLM or DeepSpeed: any process can decode any
message kernelrl puts on the bus.
"""
from schemas.codec import SchemaError, decode, encode, encode_json_safe  # noqa: F401
from schemas.messages import *  # noqa: F403
