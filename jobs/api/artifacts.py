"""REST endpoints of what a job reports and leaves: its metrics history, its checkpoints, its final model.

Downloads are streamed (``FileResponse`` for the model file, ``StreamingHttpResponse`` for a checkpoint
built while it is sent); another tenant's job answers 404 exactly like a missing one.
"""

from __future__ import annotations

from django.http import FileResponse, HttpResponseBase, StreamingHttpResponse
from django.urls import reverse
from django.utils.http import content_disposition_header
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.domain import Invalid
from jobs import services
from jobs.api.schema import BINARY, METRIC_PARAMETERS, query, whole_number
from jobs.contracts import Download, checkpoint_json, final_model_json, metric_series_json
from jobs.telemetry import METRIC_NAME
from tenants.permissions import RequireScope, request_tenant_id

# The largest step a query may name (the column is a 64-bit integer; ``to`` is inclusive).
MAX_STEP = 2**63 - 1


def _names(request: Request) -> list[str]:
    """``?name=loss,accuracy`` or ``?name=loss&name=accuracy`` (or both)."""
    names = [n.strip() for value in request.query_params.getlist("name") for n in value.split(",") if n.strip()]
    for name in names:
        if not METRIC_NAME.fullmatch(name):
            raise Invalid(f"{name[:80]!r} is not a metric name: 1-64 letters, digits or any of _ . : / -", field="name")
    return names


class JobMetricsView(APIView):
    """``GET /jobs/{id}/metrics?name=&from=&to=&points=``: the job's series, downsampled to ``points``."""

    permission_classes = [RequireScope]

    @extend_schema(summary="The job's metric series", parameters=METRIC_PARAMETERS)
    def get(self, request: Request, job_id: int) -> Response:
        tenant_id = request_tenant_id(request)
        points = whole_number(request, "points", low=1, high=services.MAX_METRIC_POINTS)
        series = services.metric_series(
            tenant_id=tenant_id,
            job_id=job_id,
            names=_names(request),
            first_step=whole_number(request, "from", low=0, high=MAX_STEP),
            last_step=whole_number(request, "to", low=0, high=MAX_STEP),
            points=services.DEFAULT_METRIC_POINTS if points is None else points,
        )
        return Response(metric_series_json(job_id, series))


class JobCheckpointsView(APIView):
    """``GET /jobs/{id}/checkpoints``: committed checkpoints, newest first, and the final model."""

    permission_classes = [RequireScope]

    def get(self, request: Request, job_id: int) -> Response:
        listing = services.job_checkpoints(tenant_id=request_tenant_id(request), job_id=job_id)
        return Response(
            {
                "job": job_id,
                "checkpoints": [
                    checkpoint_json(
                        c, reverse("api-job-checkpoint-download", kwargs={"job_id": job_id, "step": c.step})
                    )
                    for c in listing.checkpoints
                ],
                "final_model": final_model_json(listing.final_model, reverse("api-job-model", args=[job_id])),
            }
        )


def _send(download: Download) -> HttpResponseBase:
    response: HttpResponseBase
    if hasattr(download.body, "read"):  # an open file: FileResponse sends it in blocks (or by sendfile)
        response = FileResponse(download.body, content_type=download.content_type)
    else:
        response = StreamingHttpResponse(download.body, content_type=download.content_type)
    if download.size_bytes is not None:
        response["Content-Length"] = str(download.size_bytes)
    response["Content-Disposition"] = content_disposition_header(True, download.filename)
    response["X-Content-Type-Options"] = "nosniff"
    return response


class CheckpointDownloadView(APIView):
    """``GET /jobs/{id}/checkpoints/{step}/download[?file=weights.pt]``: the checkpoint as one tar
    (manifest and files under ``step-NNNNNNNNNN/``), or one of its files alone."""

    permission_classes = [RequireScope]

    @extend_schema(
        summary="Download a checkpoint",
        parameters=[query("file", description="One file of the checkpoint alone, e.g. weights.pt.")],
        responses={
            (200, "application/x-tar"): OpenApiResponse(BINARY, description="The whole checkpoint."),
            (200, "application/octet-stream"): OpenApiResponse(BINARY, description="One file of it (?file=)."),
        },
    )
    def get(self, request: Request, job_id: int, step: int) -> HttpResponseBase:
        file = request.query_params.get("file") or None
        download = services.checkpoint_download(
            tenant_id=request_tenant_id(request), job_id=job_id, step=step, file=file
        )
        return _send(download)


class ModelDownloadView(APIView):
    """``GET /jobs/{id}/model``: the final model's state_dict, as rank 0 saved it (``torch.load`` reads it)."""

    permission_classes = [RequireScope]

    @extend_schema(
        summary="Download the final model",
        responses={(200, "application/octet-stream"): OpenApiResponse(BINARY, description="model.pt")},
    )
    def get(self, request: Request, job_id: int) -> HttpResponseBase:
        return _send(services.model_download(tenant_id=request_tenant_id(request), job_id=job_id))
