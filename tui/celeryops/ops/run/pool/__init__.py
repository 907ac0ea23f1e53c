"""Two revisions on one Cloud Run worker pool: the mechanics the overlap and canary strategies share."""
