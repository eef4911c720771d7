"""`manage.py ensure_admin`: the superuser of `CACHET_ADMIN_PASSWORD`, created or reset."""
