from django.urls import path

from jobs.api import views

urlpatterns = [
    path("jobs", views.JobListView.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>", views.JobDetailView.as_view(), name="api-job"),
    path("jobs/<int:job_id>/cancel", views.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<int:job_id>/events", views.JobEventsView.as_view(), name="api-job-events"),
    path("jobs/<int:job_id>/usage", views.JobUsageView.as_view(), name="api-job-usage"),
    path("pool", views.PoolView.as_view(), name="api-pool"),
    path("quotas", views.QuotaView.as_view(), name="api-quotas"),
    path("queue", views.QueueView.as_view(), name="api-queue"),
    path("throughput", views.ThroughputView.as_view(), name="api-throughput"),
    path("ingest/jobs/<int:job_id>/telemetry", views.TelemetryIngestView.as_view(), name="api-ingest-telemetry"),
]
