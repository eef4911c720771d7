from django.urls import path

from frontend import views

app_name = "frontend"
urlpatterns = [
    path("", views.chat, name="chat"),
    path("c/<int:conversation_id>/", views.chat, name="conversation"),
    path("documents/<int:document_id>/", views.document, name="document"),
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
]
