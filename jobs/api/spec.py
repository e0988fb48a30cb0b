"""The job spec outside a submit: ``GET /api/v1/job-spec/schema`` (the spec as JSON Schema, from the
tables the parser checks against, ``runtime.jobspec.job_spec_schema``, for editors, the CLI and the
portal's spec editor; public: it describes the product, not a tenant's data), ``POST
/api/v1/jobs/preview`` (a spec checked as submit checks it, with what admission would do now) and
``POST /api/v1/jobs/advise`` (the advisor: admission, start time, batch, checkpoints, comm and cost,
each with its reasoning)."""

from __future__ import annotations

from functools import cache
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import services as billing
from controlplane.idempotency import changed_nothing
from controlplane.parsers import StrictJSONParser, YamlParser
from jobs import services
from jobs.api.schema import ADVICE, JOB_SPEC
from jobs.contracts import admission_preview_json, job_advice_json
from runtime.jobspec import job_spec_schema, parse_job_spec
from tenants.permissions import READ, RequireScope, request_tenant_id


@cache
def _schema() -> dict[str, Any]:
    return job_spec_schema()


class JobSpecSchemaView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response(_schema(), headers={"Cache-Control": "public, max-age=300"})


class JobPreviewView(APIView):
    """Check a spec and ask admission about it, storing nothing: the portal's submit form calls it as
    the spec is typed. Reading, not changing: a read scope is enough."""

    permission_classes = [RequireScope]
    method_scopes = {"POST": READ}
    parser_classes = [StrictJSONParser, YamlParser]

    @extend_schema(
        summary="Check a job spec and preview its admission, without submitting it",
        description="The body is a job spec, as JSON or YAML (Content-Type: application/yaml). A spec with "
        "problems is answered 400 with every problem in error.errors, as submit answers it. A valid one "
        "gets its normalized form, whether the next admission cycle would start it (on which flavors, "
        "charging how many NAU) or why it would wait, and what an hour of it costs at the tenant's prices.",
        request={"application/json": JOB_SPEC, "application/yaml": JOB_SPEC},
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="The spec and its admission now.")},
    )
    def post(self, request: Request) -> Response:
        tenant_id = request_tenant_id(request)
        spec = parse_job_spec(request.data, known_flavors=services.known_flavors())
        preview = services.preview_submit(tenant_id=tenant_id, spec=spec)
        cost, pricing_error = None, None
        if preview.devices:
            devices = {f: (n, preview.nau_milli_per_device[f]) for f, n in preview.devices.items()}
            try:
                cost = str(billing.hourly_cost(tenant_id=tenant_id, devices=devices))
            except billing.RatingError as exc:
                pricing_error = str(exc)
        # A question, not a change: an Idempotency-Key sent with it stays free for the real submit.
        return changed_nothing(
            Response(
                {
                    "spec": spec.to_dict(),
                    "admission": admission_preview_json(preview),
                    "cost_per_hour": cost,
                    "currency": billing.price_book_for(tenant_id).currency,
                    "pricing_error": pricing_error,
                }
            )
        )


class JobAdviseView(APIView):
    """The advisor at submit: what submitting the spec now would do and how the job would run, each
    answer with the figures behind it in words. Reading, not changing: a read scope is enough."""

    permission_classes = [RequireScope]
    method_scopes = {"POST": READ}
    parser_classes = [StrictJSONParser, YamlParser]

    @extend_schema(
        summary="Advise on a job spec before submitting it",
        description="The body is a job spec, as JSON or YAML (Content-Type: application/yaml); a spec with "
        "problems is answered 400 with every problem in error.errors, as submit answers it. A valid one gets, "
        "each part with its reasoning in sentences: whether the next admission cycle would start it and where, "
        "why it would wait, or why it never could (a spec that could never start is advised, not refused); "
        "when it is expected to start (the live queue played forward by the scheduler); each flavor's "
        "micro-batch within about 70% of its memory and the accumulation steps; Young's and Daly's "
        "checkpoint intervals; what compression: auto would choose on the cross-group link; the NAU charge "
        "and the cost per hour at the tenant's prices. summary holds each part's headline. Nothing is stored.",
        request={"application/json": JOB_SPEC, "application/yaml": JOB_SPEC},
        responses={200: OpenApiResponse(ADVICE, description="The advice, part by part.")},
    )
    def post(self, request: Request) -> Response:
        spec = parse_job_spec(request.data, known_flavors=services.known_flavors())
        advice = services.advise_submit(tenant_id=request_tenant_id(request), spec=spec)
        return changed_nothing(Response({"spec": spec.to_dict(), **job_advice_json(advice)}))
