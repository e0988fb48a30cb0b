from django.urls import path

from jobs.api import actions, artifacts, bundles, logs, operator, spec, views

urlpatterns = [
    path("jobs", views.JobListView.as_view(), name="api-jobs"),
    path("jobs/preview", spec.JobPreviewView.as_view(), name="api-job-preview"),
    path("job-spec/schema", spec.JobSpecSchemaView.as_view(), name="api-job-spec-schema"),
    path("jobs/<int:job_id>", views.JobDetailView.as_view(), name="api-job"),
    path("jobs/<int:job_id>/cancel", views.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<int:job_id>/retry", actions.JobRetryView.as_view(), name="api-job-retry"),
    path("jobs/<int:job_id>/priority", actions.JobPriorityView.as_view(), name="api-job-priority"),
    path("jobs/<int:job_id>/wait", actions.JobWaitView.as_view(), name="api-job-wait"),
    path("jobs/<int:job_id>/events", views.JobEventsView.as_view(), name="api-job-events"),
    path("jobs/<int:job_id>/usage", views.JobUsageView.as_view(), name="api-job-usage"),
    path("jobs/<int:job_id>/outlook", views.JobOutlookView.as_view(), name="api-job-outlook"),
    path("jobs/<int:job_id>/logs", logs.JobLogsView.as_view(), name="api-job-logs"),
    path("jobs/<int:job_id>/metrics", artifacts.JobMetricsView.as_view(), name="api-job-metrics"),
    path("jobs/<int:job_id>/checkpoints", artifacts.JobCheckpointsView.as_view(), name="api-job-checkpoints"),
    path(
        "jobs/<int:job_id>/checkpoints/<int:step>/download",
        artifacts.CheckpointDownloadView.as_view(),
        name="api-job-checkpoint-download",
    ),
    path("jobs/<int:job_id>/model", artifacts.ModelDownloadView.as_view(), name="api-job-model"),
    path("bundles", bundles.BundleListView.as_view(), name="api-bundles"),
    path("bundles/<str:sha256>", bundles.BundleDetailView.as_view(), name="api-bundle"),
    path("pool", views.PoolView.as_view(), name="api-pool"),
    path("quotas", views.QuotaView.as_view(), name="api-quotas"),
    path("quotas/history", views.QuotaHistoryView.as_view(), name="api-quota-history"),
    path("queue", views.QueueView.as_view(), name="api-queue"),
    path("throughput", views.ThroughputView.as_view(), name="api-throughput"),
    path("operator/cluster", operator.ClusterView.as_view(), name="api-operator-cluster"),
    path("operator/nodes/<str:node>/drain", operator.NodeDrainView.as_view(), name="api-operator-node-drain"),
    path(
        "operator/devices/<path:device_id>/health",
        operator.DeviceHealthView.as_view(),
        name="api-operator-device-health",
    ),
    path("operator/queue", operator.OperatorQueueView.as_view(), name="api-operator-queue"),
    path("operator/utilization", operator.UtilizationView.as_view(), name="api-operator-utilization"),
    path("operator/device-events", operator.DeviceEventsView.as_view(), name="api-operator-device-events"),
    path("ingest/jobs/<int:job_id>/telemetry", views.TelemetryIngestView.as_view(), name="api-ingest-telemetry"),
]
