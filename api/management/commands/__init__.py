"""`manage.py ensure_api_key`: the bootstrap API key of an unattended deployment."""
