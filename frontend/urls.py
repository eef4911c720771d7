from django.urls import path

from frontend import dashboard, documents, evaluation, retrieval_test, views

app_name = "frontend"
urlpatterns = [
    path("", views.chat, name="chat"),
    path("c/<int:conversation_id>/", views.chat, name="conversation"),
    path("documents/<int:document_id>/", documents.document, name="document"),
    path("documents/<int:document_id>/text/", documents.document_text, name="document-text"),
    path("staff/retrieval/", retrieval_test.retrieval_test, name="retrieval-test"),
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
    path("jsi18n/<str:language>/", views.javascript_catalog, name="javascript-catalog"),
    path("staff/dashboard/", dashboard.dashboard, name="dashboard"),
    path("staff/dashboard/data/", dashboard.dashboard_data, name="dashboard-data"),
    path("staff/dashboard/benchmark.png", dashboard.benchmark_chart, name="benchmark-chart"),
    path("staff/evaluation/", evaluation.evaluation, name="evaluation"),
    path("staff/evaluation/data/", evaluation.evaluation_data, name="evaluation-data"),
    path("staff/evaluation/runs/", evaluation.evaluation_start, name="evaluation-start"),
    path("staff/evaluation/runs/<int:run_id>/", evaluation.evaluation_run, name="evaluation-run"),
]
