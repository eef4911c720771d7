"""The WebSocket side of the ASGI app: origin check, session auth, then the URL routes.

A function, not a module-level object, so tests build the production stack without importing
chatsite.asgi (which starts the engine).
"""

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator


def websocket_application():
    from frontend.routing import websocket_urlpatterns

    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
