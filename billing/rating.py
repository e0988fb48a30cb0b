"""Rating: usage in integer milliseconds in, invoice lines in exact money out. Plain Python, no Django.

Every figure stays an integer until a line is rounded: a price of up to 12 decimal places per hour is
held as an integer count of 1e-12 currency units, a line's quantity as device-milliseconds (or
milli-NAU-milliseconds), and a line's amount is their product over one fixed denominator, rounded half
up to the cent once. So rounding happens once per line, never per event, and no float ever holds money.

Periods are UTC calendar months, named by their first day. Prices take effect at UTC midnight of
their ``effective_from`` date; a usage that spans a price change is split at that instant.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import MAX_PREC, Context, Decimal
from typing import Final

MS_PER_HOUR = 3_600_000
MILLI_NAU = 1000  # a usage's NAU rate is in thousandths of a NAU per device
PRICE_DECIMALS: Final = 12  # Final: a literal, so that 10**PRICE_DECIMALS is typed int, not Any
PRICE_SCALE = 10**PRICE_DECIMALS
CENTS = 100
NAU = "nau"  # the price book resource that prices normalized accelerator units

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class RatingError(ValueError):
    """Usage that cannot be rated, with what to fix."""


class Unpriced(RatingError):
    def __init__(self, flavor: str, on: date, book: str) -> None:
        super().__init__(
            f"price book {book!r} has no price for flavor {flavor!r} (nor a per-NAU price) in effect on "
            f"{on.isoformat()}: add one in the admin (Billing > Price books)"
        )
        self.flavor = flavor
        self.on = on


# --- time -----------------------------------------------------------------------------------------


def epoch_ms(moment: datetime) -> int:
    """Whole milliseconds since the epoch, truncated (a datetime's microseconds below 1 ms are dropped)."""
    delta = moment - _EPOCH
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def from_epoch_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def day_start_ms(day: date) -> int:
    return (day - date(1970, 1, 1)).days * 86_400_000


def period_of(ms: int) -> date:
    """The billing period (first day of the UTC month) that holds the instant ``ms``."""
    return day_of(ms).replace(day=1)


def next_period(period: date) -> date:
    return date(period.year + period.month // 12, period.month % 12 + 1, 1)


def previous_period(period: date) -> date:
    return date(period.year - (period.month == 1), (period.month - 2) % 12 + 1, 1)


def period_bounds_ms(period: date) -> tuple[int, int]:
    return day_start_ms(period), day_start_ms(next_period(period))


def split_by_period(start_ms: int, duration_ms: int) -> list[tuple[date, int, int]]:
    """Cut ``[start, start + duration)`` at month boundaries: (period, piece start, piece ms) each.

    The pieces' milliseconds always add up to ``duration_ms``; a zero-length usage is one empty piece
    (it is still recorded, so a replay of it is recognised).
    """
    if duration_ms < 0:
        raise RatingError(f"a usage cannot last {duration_ms} ms")
    pieces: list[tuple[date, int, int]] = []
    cursor, end = start_ms, start_ms + duration_ms
    while True:
        period = period_of(cursor)
        boundary = period_bounds_ms(period)[1]
        piece_end = min(end, boundary)
        pieces.append((period, cursor, piece_end - cursor))
        if piece_end >= end:
            return pieces
        cursor = piece_end


def split_by_day(start_ms: int, duration_ms: int) -> list[tuple[date, int, int]]:
    """Cut ``[start, start + duration)`` at UTC midnights: (day, piece start, piece ms) each; the
    pieces add up to ``duration_ms``."""
    if duration_ms < 0:
        raise RatingError(f"a usage cannot last {duration_ms} ms")
    pieces: list[tuple[date, int, int]] = []
    cursor, end = start_ms, start_ms + duration_ms
    while True:
        day = day_of(cursor)
        piece_end = min(end, day_start_ms(day) + 86_400_000)
        pieces.append((day, cursor, piece_end - cursor))
        if piece_end >= end:
            return pieces
        cursor = piece_end


# --- prices ---------------------------------------------------------------------------------------


def price_units(price: Decimal) -> int:
    """A price per hour as an integer of 1e-12 currency units; more decimals than that is an error."""
    if not price.is_finite() or price < 0:
        raise RatingError(f"a price must be a non-negative amount, not {price}")
    scaled = price.scaleb(PRICE_DECIMALS, context=Context(prec=MAX_PREC))  # exact: never rounded to 28 digits
    if scaled != scaled.to_integral_value():
        raise RatingError(f"price {price} has more than {PRICE_DECIMALS} decimal places")
    return int(scaled)


def units_to_price(units: int) -> Decimal:
    return Decimal(units).scaleb(-PRICE_DECIMALS).quantize(Decimal(1).scaleb(-PRICE_DECIMALS))


@dataclass(frozen=True)
class PriceChange:
    resource: str  # a flavor name, or NAU
    effective_from: date
    per_hour: Decimal


class PriceBook:
    """A book's prices over time: a flavor's own price where it has one, else the book's NAU price."""

    def __init__(self, name: str, changes: Iterable[PriceChange], currency: str = "USD") -> None:
        self.name = name
        self.currency = currency
        by_resource: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for change in changes:
            by_resource[change.resource].append((day_start_ms(change.effective_from), price_units(change.per_hour)))
        self._schedules = {resource: sorted(rows) for resource, rows in by_resource.items()}
        self._merged_cache: dict[str, list[tuple[int, str, int]]] = {}

    def segments(self, flavor: str, start_ms: int, duration_ms: int) -> list[tuple[str, int, int]]:
        """``(resource, price units, ms)`` for each stretch of the usage under one price."""
        schedule = self._merged(flavor)
        starts = [at for at, _, _ in schedule]
        index = bisect.bisect_right(starts, start_ms) - 1
        if index < 0:
            raise Unpriced(flavor, day_of(start_ms), self.name)
        out: list[tuple[str, int, int]] = []
        cursor, end = start_ms, start_ms + duration_ms
        while True:
            next_change = starts[index + 1] if index + 1 < len(starts) else None
            piece_end = end if next_change is None else min(end, next_change)
            _, resource, units = schedule[index]
            out.append((resource, units, piece_end - cursor))
            if piece_end >= end:
                return out
            cursor, index = piece_end, index + 1

    def constant_between(self, start_ms: int, end_ms: int) -> bool:
        """True when no price of the book changes inside ``(start, end)``."""
        return not any(start_ms < at < end_ms for rows in self._schedules.values() for at, _ in rows)

    def _merged(self, flavor: str) -> list[tuple[int, str, int]]:
        """``(from ms, resource, units)``: the flavor's own price once it has one, the NAU price before."""
        if flavor not in self._merged_cache:
            own = self._schedules.get(flavor, [])
            own_from = own[0][0] if own else None
            merged = [
                (at, NAU, units) for at, units in self._schedules.get(NAU, []) if own_from is None or at < own_from
            ]
            merged += [(at, flavor, units) for at, units in own]
            self._merged_cache[flavor] = merged
        return self._merged_cache[flavor]


def day_of(ms: int) -> date:
    return date.fromordinal(date(1970, 1, 1).toordinal() + ms // 86_400_000)


# --- lines ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RatedUsage:
    """One ledger entry to rate: one device of one job, inside one period."""

    job_id: int
    flavor: str
    period: date
    start_ms: int
    duration_ms: int
    nau_milli: int = MILLI_NAU  # the job's throughput on this device, in thousandths of a NAU
    # Price the whole duration at the price in effect at this instant (sums of many entries, when no
    # price changes during them); None: at the prices in effect during [start, start + duration).
    price_at: int | None = None
    # The platform or a device ended the attempt: billed as usage, and given back on a credit line.
    credited: bool = False

    def priced(self, book: PriceBook) -> list[tuple[str, int, int]]:
        """``(resource, price units, quantity)``: the usage's quantity under each price it ran at."""
        if self.price_at is not None:
            resource, units, _ = book.segments(self.flavor, self.price_at, 0)[0]
            stretches = [(resource, units, self.duration_ms)]
        else:
            stretches = book.segments(self.flavor, self.start_ms, self.duration_ms)
        return [(resource, units, ms * self.nau_milli if resource == NAU else ms) for resource, units, ms in stretches]


@dataclass(frozen=True)
class LineKey:
    kind: str  # "usage", "adjustment" for an earlier period's late usage, "credit" for usage given back
    job_id: int
    flavor: str
    usage_period: date
    resource: str  # the flavor (priced per device-hour) or NAU (per NAU-hour)
    price_units: int


@dataclass(frozen=True)
class Line:
    kind: str
    job_id: int
    flavor: str
    usage_period: date
    unit: str  # "device-hour" or "NAU-hour"
    unit_price: Decimal
    quantity_ms: int  # device-milliseconds; for NAU, milli-NAU-milliseconds
    amount: Decimal

    @property
    def hours(self) -> Decimal:
        return hours(self.quantity_ms, self.unit)


def hours(quantity_ms: int, unit: str) -> Decimal:
    """A line's quantity in its unit's hours (device-hours, or NAU-hours), to the microhour, for display."""
    scale = MS_PER_HOUR * (MILLI_NAU if unit == "NAU-hour" else 1)
    return (Decimal(quantity_ms) / Decimal(scale)).quantize(Decimal("0.000001"))


@dataclass(frozen=True)
class RatedInvoice:
    period: date
    currency: str
    lines: tuple[Line, ...]
    total: Decimal
    exact_total: tuple[int, int]  # the unrounded total as numerator over denominator, for checks


def _denominator(resource: str) -> int:
    return MS_PER_HOUR * PRICE_SCALE * (MILLI_NAU if resource == NAU else 1)


def round_cents(numerator: int, denominator: int) -> Decimal:
    """``numerator / denominator`` currency units, rounded half up to the cent (both non-negative)."""
    cents = (2 * numerator * CENTS + denominator) // (2 * denominator)
    return Decimal(cents).scaleb(-2)


def accumulate(usages: Iterable[RatedUsage], book: PriceBook, period: date) -> dict[LineKey, int]:
    """Each line's exact quantity; usage of an earlier period becomes an adjustment line."""
    quantities: dict[LineKey, int] = defaultdict(int)
    for usage in usages:
        kind = "usage" if usage.period == period else "adjustment"
        if usage.period > period:
            raise RatingError(f"usage of {usage.period:%Y-%m} cannot go on the invoice for {period:%Y-%m}")
        for resource, units, quantity in usage.priced(book):
            quantities[LineKey(kind, usage.job_id, usage.flavor, usage.period, resource, units)] += quantity
            if usage.credited:
                quantities[LineKey("credit", usage.job_id, usage.flavor, usage.period, resource, units)] += quantity
    return quantities


def rate(usages: Iterable[RatedUsage], book: PriceBook, period: date) -> RatedInvoice:
    """The invoice's lines, one per (kind, job, flavor, usage period, price), and its total."""
    quantities = accumulate(usages, book, period)
    lines: list[Line] = []
    numerator_sum, common = 0, _denominator(NAU)
    for key in sorted(quantities, key=_line_order):
        quantity = quantities[key]
        numerator, denominator = quantity * key.price_units, _denominator(key.resource)
        # A credit line gives back what its usage cost: the same quantity, a negative amount.
        sign = -1 if key.kind == "credit" else 1
        numerator_sum += sign * numerator * (common // denominator)
        lines.append(
            Line(
                kind=key.kind,
                job_id=key.job_id,
                flavor=key.flavor,
                usage_period=key.usage_period,
                unit="NAU-hour" if key.resource == NAU else "device-hour",
                unit_price=units_to_price(key.price_units),
                quantity_ms=quantity,
                amount=sign * round_cents(numerator, denominator),
            )
        )
    total = sum((line.amount for line in lines), Decimal("0.00"))
    return RatedInvoice(period, book.currency, tuple(lines), total, (numerator_sum, common))


_KIND_ORDER = {"usage": 0, "credit": 1, "adjustment": 2}


def _line_order(key: LineKey) -> tuple[object, ...]:
    return (_KIND_ORDER[key.kind], key.usage_period, key.job_id, key.flavor, key.resource, key.price_units)


def by_flavor(lines: Sequence[Line]) -> Mapping[str, Decimal]:
    """The invoice's amounts summed per flavor (sums of rounded lines, so they add up to the total)."""
    sums: dict[str, Decimal] = defaultdict(lambda: Decimal("0.00"))
    for line in lines:
        sums[line.flavor] += line.amount
    return dict(sorted(sums.items()))


def estimate(usages: Iterable[RatedUsage], book: PriceBook) -> Decimal:
    """The cost of some usage rounded once as a whole (budgets; not an invoice)."""
    numerator, common = 0, _denominator(NAU)
    for usage in usages:
        for resource, units, quantity in usage.priced(book):
            numerator += quantity * units * (common // _denominator(resource))
    return round_cents(numerator, common)
