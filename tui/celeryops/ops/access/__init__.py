"""Least privilege: the Redis ACL rules of each role (``rules``) and the check that the connected user may do what
a command is about to do, before anything changes (``probe``)."""
