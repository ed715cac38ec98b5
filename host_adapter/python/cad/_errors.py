"""The package's exception: every failure of a plugin arrives as a CadError carrying the plugin's message."""


class CadError(RuntimeError):
    """A CAD call failed. `status` is the ABI status name (e.g. "INVALID_ARGUMENT", "TIMEOUT"); the message is
    the plugin's own (it names the key, tensor or rank at fault)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
