from django.contrib import admin
from django.urls import include, path

from chatsite.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("", include("frontend.urls")),
]
