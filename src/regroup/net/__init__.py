"""Network plumbing shared by the LLM judge and the LLM rewriter: one chat client and one disk cache."""

from regroup.net.cache import DiskCache, cache_key
from regroup.net.client import ChatClient, MissingAPIKeyError, Result
from regroup.net.redact import check_key_env_name, redact

__all__ = ["ChatClient", "DiskCache", "MissingAPIKeyError", "Result", "cache_key", "check_key_env_name", "redact"]
