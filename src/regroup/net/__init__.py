"""Network plumbing shared by the LLM judge and the LLM rewriter: one chat client and one disk cache."""

from regroup.net.cache import DiskCache, cache_key
from regroup.net.client import ChatClient, MissingAPIKeyError, Result

__all__ = ["ChatClient", "DiskCache", "MissingAPIKeyError", "Result", "cache_key"]
