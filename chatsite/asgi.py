"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# NOTE: must run before importing anything that touches models (consumers, routing).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from chatsite.websockets import websocket_application  # noqa: E402
from inference import metrics_history, runtime  # noqa: E402
from retrieval import recovery  # noqa: E402

if settings.CACHET_START_ENGINE:
    # One engine per server process; it loads in the background while the server answers.
    runtime.start_engine()
    # The staff dashboard's last hour of this process's metrics, sampled from the start.
    metrics_history.start_sampler()
# The search index is checked against the database at start (an unreadable file is rebuilt), and
# with tasks run in-process, ingestions a killed server left unfinished run again; in the
# background too.
recovery.start_check_in_background()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": websocket_application(),
    }
)
