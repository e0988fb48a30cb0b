"""``GET /api/v1/job-spec/schema``: the job spec as JSON Schema, from the tables the parser checks
against (``runtime.jobspec.job_spec_schema``), for editors, the CLI and the portal's spec editor.

Public: it describes the product, not a tenant's data, and a client may check a spec before it has a
token."""

from __future__ import annotations

from functools import cache
from typing import Any

from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from runtime.jobspec import job_spec_schema


@cache
def _schema() -> dict[str, Any]:
    return job_spec_schema()


class JobSpecSchemaView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response(_schema(), headers={"Cache-Control": "public, max-age=300"})
