"""`manage.py check_backends`: probe every enabled remote backend, record its health."""
