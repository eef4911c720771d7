from django.urls import path

from chat import views

app_name = "chat"
urlpatterns = [
    path("options/", views.options, name="options"),
    path("conversations/", views.conversation_list, name="conversations"),
    path(
        "conversations/<int:conversation_id>/",
        views.conversation_detail,
        name="conversation",
    ),
    path("documents/", views.document_upload, name="document-upload"),
]
