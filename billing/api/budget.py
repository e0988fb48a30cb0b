"""The tenant's monthly budget: ``GET`` and ``PUT /api/v1/billing/budget``.

This month's spend counts the devices the tenant's jobs hold right now, which billing learns from
the usage source that the jobs app registers (``billing.usage_sources``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import services as billing
from billing.api.serializers import budget_json
from controlplane.domain import Invalid
from controlplane.parsers import StrictJSONParser
from tenants.permissions import MANAGE, READ, RequireScope, request_tenant_id

BUDGET_FIELDS = ("soft_budget", "hard_budget")
# The budget columns hold 18 digits, 2 of them decimals.
MAX_BUDGET = Decimal("9999999999999999.99")


class BudgetInput(Invalid):
    """A budget request that cannot be used (HTTP 400, naming the field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


def budget_answer(tenant_id: int) -> dict[str, Any]:
    usage = billing.open_usage([tenant_id])
    return budget_json(billing.budget_status(tenant_id, usage), billing.spend_by_flavor(tenant_id, usage))


def _amount(value: Any, field: str) -> Decimal | None:
    """A budget as a JSON number or a decimal string, exactly; null clears it."""
    if value is None:
        return None
    # A JSON number arrives as a binary number; it is read through its shortest decimal text below, never
    # used as one. (Real, not the binary type by name: billing/ never names it, see test_rating.)
    if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
        raise BudgetInput(field, f'{field} must be an amount like "500.00", or null for none; got {value!r}')
    if isinstance(value, numbers.Real) and not isinstance(value, int) and not math.isfinite(value):
        raise BudgetInput(field, f"{field} must be a finite amount, got {value!r}")
    try:
        # Through str, so that 0.1 is 0.1 and not the binary float's expansion.
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise BudgetInput(field, f'{field} must be an amount like "500.00", or null for none; got {value!r}') from None
    if amount.is_finite() and amount > MAX_BUDGET:
        raise BudgetInput(field, f"{field} must be at most {MAX_BUDGET}, got {value!r}")
    return amount


def parse_budgets(
    data: Any, *, current: tuple[Decimal | None, Decimal | None]
) -> tuple[Decimal | None, Decimal | None]:
    """``{"soft_budget", "hard_budget"}``: a field left out keeps its value, null clears it."""
    if not isinstance(data, Mapping):
        raise BudgetInput("body", f"the body must be a JSON object with {' and/or '.join(BUDGET_FIELDS)}")
    for key in data:
        if key not in BUDGET_FIELDS:
            raise BudgetInput(str(key), f"unknown field; the fields are {', '.join(BUDGET_FIELDS)}")
    if not data:
        raise BudgetInput("body", f"give {' and/or '.join(BUDGET_FIELDS)} (an amount, or null for none)")
    soft = _amount(data["soft_budget"], "soft_budget") if "soft_budget" in data else current[0]
    hard = _amount(data["hard_budget"], "hard_budget") if "hard_budget" in data else current[1]
    if soft is not None and hard is not None and soft.is_finite() and hard.is_finite() and soft > hard:
        # A soft budget alerts before the hard one stops admissions; above it, it would never alert.
        field = "soft_budget" if "soft_budget" in data else "hard_budget"
        raise BudgetInput(field, f"the soft budget ({soft}) must not exceed the hard budget ({hard})")
    return soft, hard


class BudgetView(APIView):
    """This month's spend (the ledger, usage not yet posted, devices held now) against the budgets."""

    permission_classes = [RequireScope]
    parser_classes = [StrictJSONParser]
    method_scopes = {"GET": READ, "PUT": MANAGE}

    # Refusals are answered by controlplane.errors: a bad amount 400 naming the field, usage of a flavor
    # the tenant's price book has no price for 409 "unpriced" (nothing to fix in the request).
    def get(self, request: Request) -> Response:
        return Response(budget_answer(request_tenant_id(request)))

    @extend_schema(
        summary="Set the tenant's budgets",
        description="A field left out keeps its value; null clears it. The soft budget warns, the hard one stops "
        "new work; a soft budget above the hard one is refused.",
        request={
            "application/json": {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "properties": {
                    name: {"type": ["string", "number", "null"], "description": 'An amount such as "500.00".'}
                    for name in BUDGET_FIELDS
                },
            }
        },
    )
    def put(self, request: Request) -> Response:
        tenant_id = request_tenant_id(request)
        now = billing.budget_status(tenant_id)
        soft, hard = parse_budgets(request.data, current=(now.soft_budget, now.hard_budget))
        billing.set_budgets(tenant_id, soft=soft, hard=hard)
        return Response(budget_answer(tenant_id))
