"""Wire messages (pydantic v2, JSON with a schema version) and topic rules."""

from dagsched.schemas.messages import SCHEMA_VERSION, BadMessage, decode

__all__ = ["SCHEMA_VERSION", "BadMessage", "decode"]
