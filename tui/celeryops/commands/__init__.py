"""CLI subcommands. Every module in this package that defines ``COMMANDS`` (a list of click commands)
is registered by ``celeryops.cli``: a feature adds its commands without editing a shared file."""
