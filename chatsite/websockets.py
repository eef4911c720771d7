"""The WebSocket side of the ASGI app: origin check, session auth, then each app's routes.

A function, not a module-level object, so tests build the production stack without importing
chatsite.asgi (which starts the engine).
"""

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator


def websocket_application() -> AllowedHostsOriginValidator:
    # NOTE: imported here, not at the top: the routes import consumers, which import models, so
    # they may only load once chatsite.asgi has called get_asgi_application().
    from chat import routing as chat_routing
    from retrieval import routing as retrieval_routing

    routes = chat_routing.websocket_urlpatterns + retrieval_routing.websocket_urlpatterns
    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(routes)))
