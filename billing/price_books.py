"""Price books for operators: list them, make one, schedule a price, give a tenant its book.

A price never changes what was already used: a new one takes effect at 00:00 UTC of a later day (at
the earliest, tomorrow), and a tenant's change of book with the next billing period, so every usage
record already written, and every invoice, keeps the prices it ran at. A price once scheduled stays
on record; a later one for the same resource supersedes it from its own day on.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from billing import rating
from billing.contracts import PriceBookView, PriceView
from billing.models import BillingAccount, Price, PriceBook
from controlplane import domain

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_CURRENCY = re.compile(r"[A-Z]{3}")
_RESOURCE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# The price column: 24 digits, 12 of them decimals.
MAX_PER_HOUR = Decimal("999999999999.999999999999")


class PriceBookInvalid(domain.Invalid):
    pass


class PriceBookNotFound(domain.NotFound):
    pass


def _billed_by(book: PriceBook, period: date) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tenants this book bills in ``period``, and those it will bill from their next change on."""
    now: set[str] = set()
    later: set[str] = set()
    for account in BillingAccount.objects.filter(Q(price_book=book) | Q(next_price_book=book)).select_related("tenant"):
        changed = account.next_price_book_from is not None and period >= account.next_price_book_from
        current = account.next_price_book_id if changed else account.price_book_id
        if current == book.pk:
            now.add(account.tenant.slug)
        elif account.next_price_book_id == book.pk and not changed:
            later.add(account.tenant.slug)
    return tuple(sorted(now)), tuple(sorted(later))


def _view(book: PriceBook, period: date) -> PriceBookView:
    prices = tuple(
        PriceView(resource=p.resource, per_hour=p.per_hour, effective_from=p.effective_from)
        for p in sorted(book.prices.all(), key=lambda p: (p.resource, p.effective_from))
    )
    tenants, next_tenants = _billed_by(book, period)
    return PriceBookView(
        id=book.pk,
        name=book.name,
        currency=book.currency,
        is_default=book.is_default,
        description=book.description,
        prices=prices,
        tenants=tenants,
        next_tenants=next_tenants,
        next_from=rating.next_period(period),
    )


def _books() -> QuerySet[PriceBook]:
    return PriceBook.objects.prefetch_related("prices").order_by("-is_default", "name")


def _period_now() -> date:
    return rating.period_of(rating.epoch_ms(timezone.now()))


def list_price_books() -> list[PriceBookView]:
    period = _period_now()
    return [_view(book, period) for book in _books()]


def get_price_book(book_id: int) -> PriceBookView:
    book = _books().filter(pk=book_id).first()
    if book is None:
        raise PriceBookNotFound(f"no price book {book_id}", field="price_book")
    return _view(book, _period_now())


def create_price_book(
    *, name: str, currency: str, description: str = "", copy_from: int | None = None
) -> PriceBookView:
    """A new book; with ``copy_from``, holding that book's prices (its whole schedule)."""
    if not _NAME.fullmatch(name):
        raise PriceBookInvalid(f"name: lower-case letters, digits and dashes, at most 63; got {name!r}", field="name")
    if not _CURRENCY.fullmatch(currency):
        raise PriceBookInvalid(f"currency: a three-letter ISO 4217 code like USD; got {currency!r}", field="currency")
    source = None
    if copy_from is not None:
        source = PriceBook.objects.filter(pk=copy_from).first()
        if source is None:
            raise PriceBookNotFound(f"copy_from: no price book {copy_from}", field="copy_from")
    try:
        with transaction.atomic():
            book = PriceBook.objects.create(name=name, currency=currency, description=description[:500])
            if source is not None:
                Price.objects.bulk_create(
                    Price(book=book, resource=p.resource, per_hour=p.per_hour, effective_from=p.effective_from)
                    for p in source.prices.all()
                )
    except IntegrityError:
        raise PriceBookInvalid(f"name: a price book named {name!r} exists; choose another", field="name") from None
    return get_price_book(book.pk)


def schedule_price(
    *, book_id: int, resource: str, per_hour: Decimal, effective_from: date, now: datetime | None = None
) -> PriceBookView:
    """Set ``resource``'s price per hour (a flavor's per device-hour, ``nau``'s per NAU-hour) from
    ``effective_from`` on; that day must be after today (UTC)."""
    if not _RESOURCE.fullmatch(resource):
        raise PriceBookInvalid(f"resource: 'nau' or a flavor name, got {resource!r}", field="resource")
    if (
        not per_hour.is_finite()
        or per_hour < 0
        or per_hour > MAX_PER_HOUR
        or per_hour != per_hour.quantize(Decimal("1e-12"))
    ):
        raise PriceBookInvalid(
            f"per_hour: an amount from 0 to {MAX_PER_HOUR} with at most 12 decimals, got {per_hour}", field="per_hour"
        )
    today = rating.day_of(rating.epoch_ms(now or timezone.now()))
    if effective_from <= today:
        raise PriceBookInvalid(
            f"effective_from: a price takes effect from a later day than today ({today}), so that usage already "
            f"recorded keeps its price; the earliest is {today + timedelta(days=1)}",
            field="effective_from",
        )
    if not PriceBook.objects.filter(pk=book_id).exists():
        raise PriceBookNotFound(f"no price book {book_id}", field="price_book")
    Price.objects.update_or_create(
        book_id=book_id, resource=resource, effective_from=effective_from, defaults={"per_hour": per_hour}
    )
    return get_price_book(book_id)


def assign_price_book(*, tenant_id: int, book_id: int | None, now: datetime | None = None) -> PriceBookView:
    """Bill the tenant with the book (None: the default one) from the next billing period on: usage of
    the open period keeps the prices it runs at. The book must price NAU-hours from then on, the
    fallback of every flavor without a price of its own. Returns the book, with when it starts."""
    period = rating.period_of(rating.epoch_ms(now or timezone.now()))
    starts = rating.next_period(period)
    book = PriceBook.objects.filter(pk=book_id).first() if book_id is not None else None
    if book_id is not None and book is None:
        raise PriceBookNotFound(f"price_book: no price book {book_id}", field="price_book")
    if book is not None and not book.prices.filter(resource=rating.NAU, effective_from__lte=starts).exists():
        raise PriceBookInvalid(
            f"price_book: {book.name} has no nau price in effect on {starts}, the day it would start billing; "
            "every flavor without a price of its own is charged per NAU-hour: schedule one first",
            field="price_book",
        )
    with transaction.atomic():
        account, _ = BillingAccount.objects.select_for_update().get_or_create(tenant_id=tenant_id)
        if account.next_price_book_from is not None and account.next_price_book_from <= period:
            account.price_book_id = account.next_price_book_id  # the earlier change has taken effect
        account.next_price_book_id = book.pk if book is not None else None
        account.next_price_book_from = starts
        account.save(update_fields=["price_book", "next_price_book", "next_price_book_from", "updated_at"])
    return _view(book if book is not None else _default(), period)


def _default() -> PriceBook:
    book = PriceBook.objects.filter(is_default=True).first()
    if book is None:
        raise PriceBookNotFound("no default price book", field="price_book")
    return book
