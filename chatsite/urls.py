from django.contrib import admin
from django.urls import include, path

from api import v1
from chatsite.health import healthz
from inference.views import metrics

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # NOTE: vLLM's name for it, which load testers probe before a run (guidellm: GET /health).
    path("health", healthz, name="health"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("chat/api/", include("chat.urls")),
    path("v1/", v1.api.urls),
    # set_language: POST only, CSRF-checked; keeps the choice in Django's language cookie.
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include("frontend.urls")),
]
