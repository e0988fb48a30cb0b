"""Rating, table by table: integer milliseconds in, money rounded half up once per line out.

The oracles here are independent of billing/rating.py: month boundaries come from ``calendar.timegm``,
amounts from ``fractions.Fraction``. The last test reads billing/ itself: no float anywhere.
"""

from __future__ import annotations

import ast
import calendar
import random
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from billing import rating
from billing.rating import NAU, PriceBook, PriceChange, RatedUsage

H = rating.MS_PER_HOUR
DAY = 86_400_000


def month_ms(year: int, month: int, day: int = 1) -> int:
    """Epoch milliseconds of a UTC midnight, computed without billing.rating."""
    return calendar.timegm((year, month, day, 0, 0, 0, 0, 0, 0)) * 1000


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def half_up_cents(exact: Fraction) -> Decimal:
    """The oracle: an exact amount rounded half up to the cent (non-negative amounts)."""
    cents = (exact * 100 + Fraction(1, 2)).__floor__()
    return Decimal(cents).scaleb(-2)


# --- time ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "expected"),
    [
        (utc(1970, 1, 1), 0),
        (utc(1970, 1, 1, 0, 0, 0, 999), 0),  # below 1 ms: dropped
        (utc(1970, 1, 1, 0, 0, 0, 1_000), 1),
        (utc(1970, 1, 1, 0, 0, 1, 999_999), 1_999),  # truncated, never rounded up
        (utc(2026, 12, 1, 23, 59, 59, 999_999), month_ms(2026, 12, 1) + DAY - 1),
        (utc(2028, 2, 29, 12), month_ms(2028, 2, 29) + 12 * H),
        (datetime(2027, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))), month_ms(2027, 1)),  # an offset is honoured
        (utc(1969, 12, 31, 23, 59, 59, 999_500), -1),  # before the epoch: the ms that holds it (floor)
    ],
)
def test_epoch_ms_truncates_to_whole_milliseconds(moment: datetime, expected: int) -> None:
    assert rating.epoch_ms(moment) == expected
    assert rating.epoch_ms(rating.from_epoch_ms(expected)) == expected


def test_a_duration_is_the_difference_of_truncated_instants() -> None:
    start = utc(2026, 12, 1, 23, 59, 59, 999_999)
    # 1 µs later is the next millisecond on the grid: both ends are truncated the same way.
    assert rating.epoch_ms(start + timedelta(microseconds=1)) - rating.epoch_ms(start) == 1
    assert (
        rating.epoch_ms(start + timedelta(microseconds=999)) - rating.epoch_ms(start + timedelta(microseconds=1)) == 0
    )


@pytest.mark.parametrize(
    ("at", "period", "following", "preceding"),
    [
        (month_ms(2027, 1) - 1, date(2026, 12, 1), date(2027, 1, 1), date(2026, 11, 1)),
        (month_ms(2027, 1), date(2027, 1, 1), date(2027, 2, 1), date(2026, 12, 1)),
        (month_ms(2028, 2, 29), date(2028, 2, 1), date(2028, 3, 1), date(2028, 1, 1)),
        (month_ms(2028, 3) - 1, date(2028, 2, 1), date(2028, 3, 1), date(2028, 1, 1)),
        (month_ms(2027, 11, 30), date(2027, 11, 1), date(2027, 12, 1), date(2027, 10, 1)),
    ],
)
def test_periods_are_utc_calendar_months(at: int, period: date, following: date, preceding: date) -> None:
    assert rating.period_of(at) == period
    assert rating.next_period(period) == following
    assert rating.previous_period(period) == preceding
    assert rating.period_bounds_ms(period) == (
        month_ms(period.year, period.month),
        month_ms(following.year, following.month),
    )


@pytest.mark.parametrize(
    ("start", "duration", "pieces"),
    [
        # zero length: one empty piece, in the period that holds its instant
        (month_ms(2027, 1, 15), 0, [(date(2027, 1, 1), month_ms(2027, 1, 15), 0)]),
        (month_ms(2027, 2), 0, [(date(2027, 2, 1), month_ms(2027, 2), 0)]),
        # ends exactly on the boundary: the end is exclusive, one piece
        (month_ms(2027, 1, 31), DAY, [(date(2027, 1, 1), month_ms(2027, 1, 31), DAY)]),
        # 1 ms on each side of a month boundary
        (
            month_ms(2027, 2) - 1,
            2,
            [(date(2027, 1, 1), month_ms(2027, 2) - 1, 1), (date(2027, 2, 1), month_ms(2027, 2), 1)],
        ),
        # a year boundary
        (
            month_ms(2027, 1) - 1,
            1 + 5 * H,
            [(date(2026, 12, 1), month_ms(2027, 1) - 1, 1), (date(2027, 1, 1), month_ms(2027, 1), 5 * H)],
        ),
        # a leap February is 29 days, a common one 28
        (
            month_ms(2028, 1, 31),
            31 * DAY,
            [
                (date(2028, 1, 1), month_ms(2028, 1, 31), DAY),
                (date(2028, 2, 1), month_ms(2028, 2), 29 * DAY),
                (date(2028, 3, 1), month_ms(2028, 3), DAY),
            ],
        ),
        (
            month_ms(2027, 1, 31),
            30 * DAY,
            [
                (date(2027, 1, 1), month_ms(2027, 1, 31), DAY),
                (date(2027, 2, 1), month_ms(2027, 2), 28 * DAY),
                (date(2027, 3, 1), month_ms(2027, 3), DAY),
            ],
        ),
        # 2100 is not a leap year, 2000 was
        (
            month_ms(2100, 2),
            29 * DAY,
            [(date(2100, 2, 1), month_ms(2100, 2), 28 * DAY), (date(2100, 3, 1), month_ms(2100, 3), DAY)],
        ),
        (month_ms(2000, 2), 29 * DAY, [(date(2000, 2, 1), month_ms(2000, 2), 29 * DAY)]),
        # across a whole year: 13 pieces, the first and last partial
        (
            month_ms(2027, 12, 31) + 7,
            month_ms(2029, 1) + 3 - (month_ms(2027, 12, 31) + 7),
            [(date(2027, 12, 1), month_ms(2027, 12, 31) + 7, DAY - 7)]
            + [(date(2028, m, 1), month_ms(2028, m), month_ms(2028, m + 1) - month_ms(2028, m)) for m in range(1, 12)]
            + [
                (date(2028, 12, 1), month_ms(2028, 12), month_ms(2029, 1) - month_ms(2028, 12)),
                (date(2029, 1, 1), month_ms(2029, 1), 3),
            ],
        ),
    ],
)
def test_split_by_period_cuts_at_month_boundaries(
    start: int, duration: int, pieces: list[tuple[date, int, int]]
) -> None:
    assert rating.split_by_period(start, duration) == pieces
    assert sum(ms for _, _, ms in pieces) == duration


def test_split_by_period_loses_no_millisecond() -> None:
    rng = random.Random(8)
    lo, hi = month_ms(2026, 11), month_ms(2029, 3)
    for _ in range(2_000):
        start, duration = rng.randrange(lo, hi), rng.choice([0, 1, rng.randrange(DAY), rng.randrange(400 * DAY)])
        pieces = rating.split_by_period(start, duration)
        assert sum(ms for _, _, ms in pieces) == duration
        cursor = start
        for period, piece_start, ms in pieces:
            assert piece_start == cursor
            assert month_ms(period.year, period.month) <= piece_start
            following = date(period.year + period.month // 12, period.month % 12 + 1, 1)
            assert piece_start + ms <= month_ms(following.year, following.month)
            cursor += ms
        assert cursor == start + duration
        assert all(ms > 0 for _, _, ms in pieces) or len(pieces) == 1  # no empty piece unless all is empty


def test_split_by_day_cuts_at_utc_midnights_and_loses_no_millisecond() -> None:
    late = month_ms(2026, 11, 10) + DAY - 3_600_000  # 23:00 on 10 November
    assert rating.split_by_day(late, 2 * 3_600_000) == [
        (date(2026, 11, 10), late, 3_600_000),
        (date(2026, 11, 11), month_ms(2026, 11, 11), 3_600_000),
    ]
    assert rating.split_by_day(late, 0) == [(date(2026, 11, 10), late, 0)]
    rng = random.Random(9)
    for _ in range(500):
        start, duration = rng.randrange(month_ms(2026, 11), month_ms(2027, 3)), rng.randrange(40 * DAY)
        pieces = rating.split_by_day(start, duration)
        assert sum(ms for _, _, ms in pieces) == duration
        assert all(rating.day_of(at) == day and rating.day_of(at + ms - 1) == day for day, at, ms in pieces if ms)
    with pytest.raises(rating.RatingError):
        rating.split_by_day(late, -1)


def test_a_negative_duration_is_refused() -> None:
    with pytest.raises(rating.RatingError, match="-1 ms"):
        rating.split_by_period(0, -1)


# --- prices ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("price", "units"),
    [
        ("0", 0),
        ("-0", 0),
        ("2.1", 2_100_000_000_000),
        ("2.100000000000000000", 2_100_000_000_000),  # trailing zeros are not decimals that matter
        ("0.000000000001", 1),
        ("1E-12", 1),
        ("1E+3", 1_000 * 10**12),
        ("123456789012.123456789012", 123_456_789_012_123_456_789_012),
        ("999999999999.999999999999", 999_999_999_999_999_999_999_999),  # the column's widest value
    ],
)
def test_price_units_are_exact_integers_of_1e_12(price: str, units: int) -> None:
    assert rating.price_units(Decimal(price)) == units
    assert rating.units_to_price(units) == Decimal(price)


@pytest.mark.parametrize(
    ("price", "message"),
    [
        ("0.0000000000001", "more than 12 decimal places"),
        ("1E-13", "more than 12 decimal places"),
        ("2.1000000000005", "more than 12 decimal places"),
        # 31 decimals and 32 significant digits: must not be rounded to 28 digits and slip through
        ("1.0000000000000000000000000000001", "more than 12 decimal places"),
        ("-0.01", "non-negative"),
        ("-1E-13", "non-negative"),
        ("NaN", "non-negative"),
        ("Infinity", "non-negative"),
        ("-Infinity", "non-negative"),
    ],
)
def test_price_units_refuse_what_is_not_an_exact_non_negative_price(price: str, message: str) -> None:
    with pytest.raises(rating.RatingError, match=message):
        rating.price_units(Decimal(price))
    with pytest.raises(rating.RatingError):
        PriceBook("bad", [PriceChange("a100-sxm", date(2027, 1, 1), Decimal(price))])


BOOK = PriceBook(
    "test",
    [
        PriceChange(NAU, date(2027, 1, 1), Decimal("2.000000000000")),
        PriceChange("a100-sxm", date(2027, 1, 1), Decimal("2.100000000000")),
        PriceChange("a100-sxm", date(2027, 1, 15), Decimal("2.400000000000")),  # mid-month price change
        PriceChange("h100-sxm", date(2027, 1, 20), Decimal("4.250000000000")),  # own price later than NAU's
        PriceChange(NAU, date(2027, 2, 1), Decimal("2.500000000000")),
    ],
)
U = rating.price_units


@pytest.mark.parametrize(
    ("flavor", "start", "duration", "segments"),
    [
        ("a100-sxm", month_ms(2027, 1, 3), H, [("a100-sxm", U(Decimal("2.1")), H)]),
        # a price change in the middle of a usage splits it at 00:00 UTC of its day
        (
            "a100-sxm",
            month_ms(2027, 1, 15) - H,
            3 * H,
            [("a100-sxm", U(Decimal("2.1")), H), ("a100-sxm", U(Decimal("2.4")), 2 * H)],
        ),
        # starting exactly at the change: the new price only
        ("a100-sxm", month_ms(2027, 1, 15), H, [("a100-sxm", U(Decimal("2.4")), H)]),
        # ending exactly at the change: the old price only
        ("a100-sxm", month_ms(2027, 1, 15) - H, H, [("a100-sxm", U(Decimal("2.1")), H)]),
        # a flavor's own price begins later than the NAU price: per NAU before, its own after
        (
            "h100-sxm",
            month_ms(2027, 1, 20) - H,
            2 * H,
            [(NAU, U(Decimal("2")), H), ("h100-sxm", U(Decimal("4.25")), H)],
        ),
        # ... and a NAU price change after the flavor has its own price does not touch it
        ("h100-sxm", month_ms(2027, 2) - H, 2 * H, [("h100-sxm", U(Decimal("4.25")), 2 * H)]),
        # a flavor without a price of its own: the NAU schedule, with its own change
        ("mi300x", month_ms(2027, 2) - H, 2 * H, [(NAU, U(Decimal("2")), H), (NAU, U(Decimal("2.5")), H)]),
        ("mi300x", month_ms(2027, 1, 9), 0, [(NAU, U(Decimal("2")), 0)]),
    ],
)
def test_price_schedules(flavor: str, start: int, duration: int, segments: list[tuple[str, int, int]]) -> None:
    assert BOOK.segments(flavor, start, duration) == segments
    assert sum(ms for _, _, ms in segments) == duration


@pytest.mark.parametrize(
    ("book", "flavor", "start"),
    [
        (BOOK, "a100-sxm", month_ms(2027, 1) - 1),  # before every price of the book
        (BOOK, "mi300x", month_ms(2026, 12, 31)),
        (PriceBook("own-only", [PriceChange("a100-sxm", date(2027, 1, 1), Decimal(1))]), "tpu-v4", month_ms(2027, 3)),
    ],
)
def test_unpriced_usage_names_the_flavor(book: PriceBook, flavor: str, start: int) -> None:
    with pytest.raises(rating.Unpriced, match=flavor) as caught:
        rating.rate([RatedUsage(1, flavor, rating.period_of(start), start, H)], book, rating.period_of(start))
    assert caught.value.flavor == flavor
    assert caught.value.on == date(1970, 1, 1) + timedelta(days=start // DAY)
    assert caught.value.on.isoformat() in str(caught.value)
    assert repr(book.name) in str(caught.value)


def test_constant_between_sees_every_price_change_of_the_book() -> None:
    assert not BOOK.constant_between(month_ms(2027, 1), month_ms(2027, 2))  # the 15th and the 20th
    assert BOOK.constant_between(month_ms(2027, 1, 20), month_ms(2027, 2))  # changes on the bounds do not count
    assert BOOK.constant_between(month_ms(2027, 2), month_ms(2027, 3))


# --- lines and rounding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("numerator", "denominator", "cents"),
    [
        (0, 1, "0.00"),
        (5, 1_000, "0.01"),  # 0.005: half up
        (4_999_999, 1_000_000_000, "0.00"),  # 0.004999999
        (15, 1_000, "0.02"),
        (25, 1_000, "0.03"),  # half up, not to even
        (1, 3, "0.33"),
        (2, 3, "0.67"),
        (10**40 + 5 * 10**37, 10**40, "1.01"),  # 1.005 of a very large exact quotient
    ],
)
def test_round_cents_is_half_up(numerator: int, denominator: int, cents: str) -> None:
    assert rating.round_cents(numerator, denominator) == Decimal(cents)
    assert rating.round_cents(numerator, denominator) == half_up_cents(Fraction(numerator, denominator))


HALF_CENT = PriceBook("half-cent", [PriceChange("a100-sxm", date(2027, 1, 1), Decimal("18"))])  # 1 s = 0.005


def test_rounding_happens_once_per_line_and_once_for_an_estimate() -> None:
    period = date(2027, 1, 1)
    usages = [RatedUsage(job, "a100-sxm", period, month_ms(2027, 1, 2), 1_000) for job in (1, 2)]
    invoice = rating.rate(usages, HALF_CENT, period)
    assert [(line.job_id, line.amount) for line in invoice.lines] == [(1, Decimal("0.01")), (2, Decimal("0.01"))]
    assert invoice.total == Decimal("0.02")
    assert Fraction(*invoice.exact_total) == Fraction(1, 100)
    assert rating.estimate(usages, HALF_CENT) == Decimal("0.01")  # the sum rounded once


@pytest.mark.parametrize("pieces", [1_000, 100, 8, 3])
def test_never_per_event(pieces: int) -> None:
    """1 s of one job in many events: each alone would round to 0.00 (or 0.01); the line rounds once."""
    period = date(2027, 1, 1)
    start, step = month_ms(2027, 1, 2), 1_000 // pieces
    usages = [RatedUsage(5, "a100-sxm", period, start + i * step, step) for i in range(pieces - 1)]
    usages.append(RatedUsage(5, "a100-sxm", period, start + (pieces - 1) * step, 1_000 - (pieces - 1) * step))
    [line] = rating.rate(usages, HALF_CENT, period).lines
    assert (line.quantity_ms, line.amount, line.unit_price) == (1_000, Decimal("0.01"), Decimal("18.000000000000"))


@pytest.mark.parametrize(
    ("price", "quantity_ms", "amount"),
    [
        ("0.000000000001", H, "0.00"),
        ("0.000000000001", 10**12 * H // 100 // 2, "0.01"),  # exactly half a cent
        ("0.000000000001", 10**12 * H // 100 // 2 - 1, "0.00"),
        ("2.100000000000", 1, "0.00"),
        ("2.100000000000", 8_572, "0.01"),  # 0.0050003...
        ("2.100000000000", 8_571, "0.00"),  # 0.0049997...
        ("999999999999.999999999999", 10**6 * H, "999999999999999999.999999"),
        ("3.333333333333", 3 * H, "10.00"),  # 9.999999999999
        ("0.333333333333", 45 * 1_000, "0.00"),
    ],
)
def test_line_amounts_are_exact_then_rounded_half_up(price: str, quantity_ms: int, amount: str) -> None:
    book = PriceBook("b", [PriceChange("a100-sxm", date(2027, 1, 1), Decimal(price))])
    period = date(2027, 1, 1)
    [line] = rating.rate([RatedUsage(1, "a100-sxm", period, month_ms(2027, 1), quantity_ms)], book, period).lines
    expected = half_up_cents(Fraction(Decimal(price)) * quantity_ms / H)
    assert line.amount == expected == Decimal(amount).quantize(Decimal("0.01"), rounding="ROUND_HALF_UP")
    assert line.quantity_ms == quantity_ms
    assert line.unit == "device-hour"


@pytest.mark.parametrize(
    ("nau_milli", "duration", "quantity", "hours", "amount"),
    [
        (1_500, H, 1_500 * H, "1.500000", "3.00"),  # 1.5 NAU for an hour at 2.00 per NAU-hour
        (1_000, 30 * 60_000, 1_000 * 30 * 60_000, "0.500000", "1.00"),
        (333, H, 333 * H, "0.333000", "0.67"),  # 0.666
        (1, 36_000, 36_000, "0.000010", "0.00"),  # 0.00001 NAU-hours (0.00002 USD)
        (0, H, 0, "0.000000", "0.00"),
    ],
)
def test_nau_lines_count_milli_nau_milliseconds(
    nau_milli: int, duration: int, quantity: int, hours: str, amount: str
) -> None:
    period = date(2027, 1, 1)
    [line] = rating.rate(
        [RatedUsage(3, "mi300x", period, month_ms(2027, 1, 2), duration, nau_milli)], BOOK, period
    ).lines
    assert (line.unit, line.unit_price, line.quantity_ms) == ("NAU-hour", Decimal("2.000000000000"), quantity)
    assert line.hours == Decimal(hours)
    assert line.amount == Decimal(amount) == half_up_cents(Fraction(quantity, 1_000 * H) * 2)


def test_an_own_priced_flavor_ignores_its_nau_rate() -> None:
    period = date(2027, 1, 1)
    [line] = rating.rate(
        [RatedUsage(3, "a100-sxm", period, month_ms(2027, 1, 2), H, nau_milli=2_500)], BOOK, period
    ).lines
    assert (line.unit, line.quantity_ms, line.amount) == ("device-hour", H, Decimal("2.10"))


def test_a_price_change_mid_usage_makes_two_lines_that_sum_to_the_total() -> None:
    period = date(2027, 1, 1)
    usages = [
        RatedUsage(1, "a100-sxm", period, month_ms(2027, 1, 15) - H, 3 * H),
        RatedUsage(1, "h100-sxm", period, month_ms(2027, 1, 20) - H, 2 * H, nau_milli=4_000),
        RatedUsage(2, "mi300x", period, month_ms(2027, 1, 31) + 23 * H, H, nau_milli=500),
    ]
    invoice = rating.rate(usages, BOOK, period)
    assert [
        (line.job_id, line.flavor, line.unit, line.unit_price, line.quantity_ms, line.amount) for line in invoice.lines
    ] == [
        (1, "a100-sxm", "device-hour", Decimal("2.100000000000"), H, Decimal("2.10")),
        (1, "a100-sxm", "device-hour", Decimal("2.400000000000"), 2 * H, Decimal("4.80")),
        (1, "h100-sxm", "device-hour", Decimal("4.250000000000"), H, Decimal("4.25")),
        (1, "h100-sxm", "NAU-hour", Decimal("2.000000000000"), 4_000 * H, Decimal("8.00")),
        (2, "mi300x", "NAU-hour", Decimal("2.000000000000"), 500 * H, Decimal("1.00")),
    ]
    assert invoice.total == sum(line.amount for line in invoice.lines) == Decimal("20.15")
    assert Fraction(*invoice.exact_total) == Fraction("20.15")
    assert rating.by_flavor(invoice.lines) == {
        "a100-sxm": Decimal("6.90"),
        "h100-sxm": Decimal("12.25"),
        "mi300x": Decimal("1.00"),
    }
    # An estimate of the same usage, rounded once, agrees here (every line is whole cents).
    assert rating.estimate(usages, BOOK) == invoice.total


def test_the_total_is_within_half_a_cent_per_line_of_the_exact_sum() -> None:
    rng = random.Random(42)
    period = date(2027, 1, 1)
    for _ in range(200):
        usages = [
            RatedUsage(
                rng.randrange(1, 6),
                rng.choice(["a100-sxm", "h100-sxm", "mi300x"]),
                period,
                month_ms(2027, 1) + rng.randrange(30 * DAY),
                rng.randrange(0, 2 * DAY),
                rng.randrange(0, 4_000),
            )
            for _ in range(rng.randrange(1, 12))
        ]
        invoice = rating.rate(usages, BOOK, period)
        exact = Fraction(*invoice.exact_total)
        assert invoice.total == sum(line.amount for line in invoice.lines)
        assert abs(Fraction(invoice.total) - exact) <= Fraction(1, 200) * len(invoice.lines)
        assert rating.estimate(usages, BOOK) == half_up_cents(exact)


def test_earlier_usage_becomes_an_adjustment_and_later_usage_is_refused() -> None:
    february = date(2027, 2, 1)
    late = RatedUsage(4, "a100-sxm", date(2027, 1, 1), month_ms(2027, 1, 31), H)
    current = RatedUsage(4, "a100-sxm", february, month_ms(2027, 2, 1), H)
    invoice = rating.rate([late, current], BOOK, february)
    assert [(line.kind, line.usage_period, line.amount) for line in invoice.lines] == [
        ("usage", february, Decimal("2.40")),
        ("adjustment", date(2027, 1, 1), Decimal("2.40")),
    ]
    with pytest.raises(rating.RatingError, match="2027-02"):
        rating.rate([current], BOOK, date(2027, 1, 1))


def test_price_at_prices_a_sum_at_one_instant() -> None:
    period = date(2027, 1, 1)
    summed = RatedUsage(0, "a100-sxm", period, month_ms(2027, 1), 5 * H, price_at=month_ms(2027, 1, 20))
    assert summed.priced(BOOK) == [("a100-sxm", U(Decimal("2.4")), 5 * H)]
    nau = RatedUsage(0, "mi300x", period, month_ms(2027, 1), 5 * H, nau_milli=2_000, price_at=month_ms(2027, 1, 3))
    assert nau.priced(BOOK) == [(NAU, U(Decimal("2")), 10_000 * H)]


# --- no float in billing/ --------------------------------------------------------------------------

BILLING = Path(__file__).resolve().parents[2] / "billing"


def _floats(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, float | complex):
            found.append(f"{node.lineno}: float literal {node.value!r}")
        elif isinstance(node, ast.Name) and node.id == "float":
            found.append(f"{node.lineno}: float")
        elif isinstance(node, ast.Attribute) and node.attr == "float":
            found.append(f"{node.lineno}: .float")
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            annotations += [arg.annotation for arg in every if arg is not None and arg.annotation is not None]
            if node.returns is not None:
                annotations.append(node.returns)
    for annotation in annotations:  # string annotations ("float | None") are code too
        for sub in ast.walk(annotation):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    parsed = ast.parse(sub.value, mode="eval")
                except SyntaxError:
                    continue
                if any(isinstance(n, ast.Name) and n.id == "float" for n in ast.walk(parsed)):
                    found.append(f"{sub.lineno}: float in the annotation {sub.value!r}")
    return found


def test_the_scan_finds_floats(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("x: float = 1.5\ndef f(a: 'float | None') -> int:\n    return int(float(a))\n")
    assert len(_floats(sample)) == 4


def test_no_float_anywhere_in_billing() -> None:
    files = sorted(BILLING.rglob("*.py"))
    assert any(path.name == "rating.py" for path in files)
    found = [f"{path.relative_to(BILLING.parent)}:{hit}" for path in files for hit in _floats(path)]
    assert not found, "money is never a float in billing/:\n" + "\n".join(found)


def test_usage_of_an_attempt_the_platform_ended_is_billed_and_credited_on_a_line_of_its_own() -> None:
    """Issue 17, item 16: the ledger stays complete (the usage line counts every millisecond) and the
    bill fair (a credit line gives back what the platform's or a device's failure cost)."""
    period = date(2027, 1, 1)
    start = month_ms(2027, 1, 3)
    lost = RatedUsage(7, "a100-sxm", period, start, 2 * H, credited=True)  # the attempt a device ended
    kept = RatedUsage(7, "a100-sxm", period, start + 2 * H, 3 * H)  # the attempt that finished
    invoice = rating.rate([lost, kept], BOOK, period)
    by_kind = {line.kind: line for line in invoice.lines}
    assert [line.kind for line in invoice.lines] == ["usage", "credit"]
    assert by_kind["usage"].quantity_ms == 5 * H and by_kind["usage"].amount == Decimal("10.50")
    assert by_kind["credit"].quantity_ms == 2 * H and by_kind["credit"].amount == Decimal("-4.20")
    assert invoice.total == Decimal("6.30") == sum(line.amount for line in invoice.lines)
    numerator, denominator = invoice.exact_total
    assert Fraction(numerator, denominator) == Fraction(63, 10)
    # Nothing credited: no credit line, the same usage line.
    plain = rating.rate([RatedUsage(7, "a100-sxm", period, start, 5 * H)], BOOK, period)
    assert [line.kind for line in plain.lines] == ["usage"] and plain.total == Decimal("10.50")
