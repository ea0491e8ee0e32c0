"""Registry errors."""


class RegistryError(RuntimeError):
    """A model version cannot be served: missing, tampered, incompatible or failing its smoke
    inference. The message says which and why."""
