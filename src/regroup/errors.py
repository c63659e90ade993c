"""The project's user-error type, in a leaf module so that any module can raise it without importing the
config (which imports most of the package's piece registries)."""


class ConfigError(ValueError):
    """A configuration problem, found before any compute; the message names the dotted key."""
