"""REST endpoints of tenants' code bundles: upload a tar.gz, list them, read one.

``POST /api/v1/bundles`` takes the tar.gz as the raw request body (``Content-Type: application/gzip`` or
``application/octet-stream``, ``?name=`` optional) or as the multipart form field ``bundle`` (with an
optional field ``name``). It answers 201 with the bundle's address, or 200 when the tenant already had
these bytes; 400 naming the problem for anything that is not a bundle Polychip takes; 413 past the size
limit. Uploading is a write like submitting a job (the ``submit`` scope); reading needs ``read``.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.body_limit import UPLOAD_FRAMING_BYTES
from controlplane.domain import Invalid
from jobs import services
from jobs.api.schema import BINARY, query
from jobs.contracts import bundle_json
from tenants.permissions import RequireScope, request_tenant_id

RAW_TYPES = frozenset({"application/gzip", "application/x-gzip", "application/octet-stream"})
HOW_TO_SEND = (
    "send the tar.gz as the request body with Content-Type: application/gzip "
    "(curl --data-binary @bundle.tar.gz -H 'Content-Type: application/gzip'), "
    "or as the multipart form field 'bundle' (curl -F bundle=@bundle.tar.gz)"
)


class BundleTooLarge(APIException):
    """413 before a byte of an upload is stored: its declared length is past the limit."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"
    field = "bundle"


def _too_large(limit: int) -> BundleTooLarge:
    return BundleTooLarge(
        f"the bundle is larger than {limit} bytes, the most a bundle may be; leave data sets, checkpoints and "
        "virtual environments out of it (code only), or ask an operator to raise POLYCHIP_BUNDLE_MAX_BYTES"
    )


def _declared_length(request: Request) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None


class BundleListView(APIView):
    permission_classes = [RequireScope]
    # Only a form is parsed; a raw body is streamed from the request by the service, never parsed.
    parser_classes = [MultiPartParser]

    def get(self, request: Request) -> Response:
        bundles = services.list_bundles(tenant_id=request_tenant_id(request))
        return Response({"bundles": [bundle_json(b) for b in bundles]})

    @extend_schema(
        summary="Upload a code bundle (tar.gz)",
        parameters=[query("name", description="A name to remember it by.")],
        request={
            "application/gzip": BINARY,
            "application/octet-stream": BINARY,
            "multipart/form-data": {"type": "object", "properties": {"bundle": BINARY}, "required": ["bundle"]},
        },
        responses={
            201: OpenApiResponse(OpenApiTypes.OBJECT, description="Stored: its sha256, size and name."),
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="The same bytes were stored before: that bundle."),
        },
    )
    def post(self, request: Request) -> Response:
        tenant_id = request_tenant_id(request)
        limit = services.bundle_max_bytes()
        declared = _declared_length(request)
        media_type = (request.content_type or "").split(";")[0].strip().lower()
        if media_type == "multipart/form-data":
            if declared is not None and declared > limit + UPLOAD_FRAMING_BYTES:
                raise _too_large(limit)
            upload = request.FILES.get("bundle")
            if upload is None:
                raise Invalid(f"the form has no field 'bundle'; {HOW_TO_SEND}", field="bundle")
            if upload.size is not None and upload.size > limit:
                raise _too_large(limit)
            name = request.POST.get("name") or upload.name or ""
            source: services.Readable = upload
        elif media_type in RAW_TYPES:
            if declared is not None and declared > limit:
                raise _too_large(limit)
            name = request.query_params.get("name") or ""
            source = request._request  # the raw body, read in chunks by the service
        else:
            raise Invalid(f"a body of type {media_type or 'none'!r} is not a bundle; {HOW_TO_SEND}", field="bundle")
        user_id = request.user.pk if request.user is not None else None
        bundle = services.store_bundle(tenant_id=tenant_id, user_id=user_id, upload_file=source, name=str(name))
        return Response(
            bundle_json(bundle),
            status=status.HTTP_201_CREATED if bundle.created else status.HTTP_200_OK,
            headers={"Location": f"/api/v1/bundles/{bundle.sha256}"},
        )


class BundleDetailView(APIView):
    permission_classes = [RequireScope]

    def get(self, request: Request, sha256: str) -> Response:
        # Another tenant's bundle answers exactly like a missing one (404).
        return Response(bundle_json(services.get_bundle(tenant_id=request_tenant_id(request), sha256=sha256)))
