from django.urls import path

from chat import collection_views, feedback_views, queue_views, views

app_name = "chat"
urlpatterns = [
    path("options/", views.options, name="options"),
    path("conversations/", views.conversation_list, name="conversations"),
    path(
        "conversations/<int:conversation_id>/",
        views.conversation_detail,
        name="conversation",
    ),
    path(
        "messages/<int:message_id>/feedback/",
        feedback_views.message_feedback,
        name="message-feedback",
    ),
    path("documents/", views.document_upload, name="document-upload"),
    path("documents/queue/", queue_views.queue, name="document-queue"),
    path("documents/bulk/", queue_views.bulk_upload, name="document-bulk-upload"),
    path(
        "documents/<int:document_id>/cancel/",
        queue_views.cancel_ingestion,
        name="document-cancel",
    ),
    path("documents/<int:document_id>/retry/", queue_views.retry_ingestion, name="document-retry"),
    path("collections/", collection_views.collection_create, name="collection-create"),
]
