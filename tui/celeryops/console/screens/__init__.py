"""One module per screen; each has its own ``styles/<name>.tcss``."""
