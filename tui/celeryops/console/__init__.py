"""The Textual console: renders ops views and events, sends operator decisions back (see ``ports``).

Only this package imports Textual. Build the app with :func:`celeryops.console.app.make_app`.
"""
