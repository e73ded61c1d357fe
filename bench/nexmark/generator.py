"""The Nexmark event generator, after the Flink Nexmark suite's model (nexmark/nexmark,
`nexmark-flink/.../generator`), vectorised with numpy and written with pyarrow.

    .venv/bin/python -m bench.nexmark.generator OUT_DIR [--events 200000] [--files 10]

Event number `k` (0, 1, ...) is the order in which the generator emits events. As in Flink's
`GeneratorConfig.nextAdjustedEventNumber`, events come in out-of-order groups of
`disorder_events`: the event emitted `k`-th is the one with the adjusted number
`a = k // n * n + k * 953 % n`, which decides both its id and its time
(`BASE_MS + a * 1e6 / rate` µs), so event time is in order up to less than `n` events' worth
of time (`disorder_ms`). `a % 50` decides the kind: 0 a person, 1-3 an auction, 4-49 a bid
(the 1:3:46 ratio). Ids follow Flink's model: a person's and an auction's id is its count so
far plus 1000; an auction's seller is a "hot" seller (the first of the last 100 people) with
probability 3/4, else one of the 1000 most recent people (or up to 10 not yet created); a
bid's auction is a hot one (the first of the last 100 auctions) with probability 1/2, else
one of the 100 most recent (or up to 10 ahead); a bid's bidder is hot (the second of the last
100 people) with probability 3/4. Prices are `round(10^(6u) * 100)` cents; an auction expires
within twice the time 100 more auctions take to appear. Channels: half of the bids come from
Google, Facebook, Baidu or Apple, the others from one of 10,000 channels whose URL carries a
`channel_id` nine times in ten.

Where this differs from Flink's code: the random numbers are numpy's (seeded PCG64), not
Java's SplittableRandom, so values differ while their distributions are the same; a bidder id
gets 1000 added once (Flink's BidGenerator adds it twice, which Beam's does not).

Columns are snake_case (the one convention of every Nexmark pipeline here):
person: id, name, email_address, credit_card, city, state, date_time, extra;
auction: id, item_name, description, initial_bid, reserve, date_time, expires, seller,
category, extra; bid: auction, bidder, price, channel, url, date_time, extra. Times are
`timestamp` (UTC, millisecond precision). Each kind is written as `files` parquet files
`<kind>/part-NNNN.parquet` in emission order, file `i` of each kind covering the same
range of emitted events; `side_input/part-0000.parquet` holds Q13's side input
(`key` 0..9999, `value` its text), as Flink's SideInputGenerator writes it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON, AUCTION, BID = 1, 3, 46
TOTAL = PERSON + AUCTION + BID
HOT_RATIO = 100  # hot sellers, bidders and auctions: the first of the last 100
ID_LEAD = 10  # ids not yet created that may be referenced
NUM_ACTIVE_PEOPLE = 1000
NUM_IN_FLIGHT_AUCTIONS = 100
CHANNELS = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
          "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
AVG_BYTES = {"person": 200, "auction": 500, "bid": 100}
SIDE_INPUT_ROWS = 10_000
TS = pa.timestamp("ms", tz="UTC")


@dataclass(frozen=True)
class Config:
    events: int = 200_000
    rate: int = 10_000  # events per second of event time (Flink's default first-event.rate)
    disorder_events: int = 1000  # out-of-order group size (Flink's outOfOrderGroupSize)
    files: int = 10
    seed: int = 42

    @property
    def delay_us(self) -> float:
        return 1_000_000.0 / self.rate

    @property
    def disorder_ms(self) -> float:
        """An upper bound of how far behind the latest event time so far an event can be."""
        return self.disorder_events * self.delay_us / 1000.0


def adjusted(k: np.ndarray, n: int) -> np.ndarray:
    """Flink's `nextAdjustedEventNumber`: the k-th emitted event's number."""
    return (k // n) * n + (k * 953) % n


def timestamp_ms(cfg: Config, number: np.ndarray) -> np.ndarray:
    return BASE_MS + (number * cfg.delay_us).astype(np.int64) // 1000


def last_person(e: np.ndarray) -> np.ndarray:
    """Flink's `lastBase0PersonId` (person proportion 1)."""
    return e // TOTAL


def last_auction(e: np.ndarray) -> np.ndarray:
    """Flink's `lastBase0AuctionId`."""
    epoch, offset = e // TOTAL, e % TOTAL
    person = offset < PERSON
    epoch = np.where(person, epoch - 1, epoch)
    offset = np.where(person | (offset >= PERSON + AUCTION), AUCTION - 1, offset - PERSON)
    return epoch * AUCTION + offset


def next_person(rng: np.random.Generator, e: np.ndarray) -> np.ndarray:
    """Flink's `nextBase0PersonId`: one of the active people, or a few not yet created."""
    people = last_person(e) + 1
    active = np.minimum(people, NUM_ACTIVE_PEOPLE)
    return people - active + (rng.random(e.size) * (active + ID_LEAD)).astype(np.int64)


def next_auction(rng: np.random.Generator, e: np.ndarray) -> np.ndarray:
    """Flink's `nextBase0AuctionId`: one of the auctions likely in flight, or a few ahead."""
    last = last_auction(e)
    low = np.maximum(last - NUM_IN_FLIGHT_AUCTIONS, 0)
    return low + (rng.random(e.size) * (last - low + 1 + ID_LEAD)).astype(np.int64)


def next_price(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(size) * 6.0) * 100.0).astype(np.int64)


def _strings(data: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(lengths.size, pa.py_buffer(offsets.tobytes()),
                                       pa.py_buffer(data.astype(np.uint8).tobytes()))


def next_strings(rng: np.random.Generator, size: int, max_length: int,
                 special: str = " ") -> pa.Array:
    """Flink's `nextString`: 3 to max_length - 1 letters, one in 13 the `special` character,
    trimmed of blanks."""
    lengths = 3 + rng.integers(0, max_length - 3, size)
    total = int(lengths.sum())
    chars = (ord("a") + rng.integers(0, 26, total)).astype(np.uint8)
    chars[rng.random(total) < 1 / 13] = ord(special)
    out = _strings(chars, lengths)
    return pc.utf8_trim_whitespace(out) if special == " " else out


class Extra:
    """Flink's `nextExtra`: a slice of one reusable 1 MB random string, of a length around the
    kind's average size less the other fields' size."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.pool = (ord("a") + rng.integers(0, 26, 1 << 20)).astype(np.uint8)

    def __call__(self, rng: np.random.Generator, current: np.ndarray, average: int) -> pa.Array:
        desired = np.maximum(average - current, 0)
        delta = np.round(desired * 0.2).astype(np.int64)
        lengths = desired - delta + (rng.random(current.size) * (2 * delta)).astype(np.int64)
        lengths[current > average] = 0
        starts = rng.integers(0, self.pool.size - lengths.max(initial=0) - 1, current.size)
        total = int(lengths.sum())
        firsts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        index = np.repeat(starts, lengths) + (np.arange(total) - firsts)
        return _strings(self.pool[index], lengths)


def _pick(values: tuple[str, ...], index: np.ndarray) -> pa.Array:
    return pc.take(pa.array(values), pa.array(index))


def _reverse32(i: int) -> int:
    """Java's `Math.abs(Integer.reverse(i))` (which keeps Integer.MIN_VALUE negative)."""
    bits = int(f"{i & 0xFFFFFFFF:032b}"[::-1], 2)
    signed = bits - (1 << 32) if bits >= 1 << 31 else bits
    return signed if signed == -(1 << 31) else abs(signed)


def channel_table(rng: np.random.Generator) -> tuple[list[str], list[str], list[str]]:
    """The hot channels' URLs, then every other channel's name and URL (Flink's caches)."""

    def base_urls(n: int) -> list[str]:
        parts = [next_strings(rng, n, 5, "_").to_pylist() for _ in range(3)]
        return [f"https://www.nexmark.com/{a}/{b}/{c}/item.htm?query=1"
                for a, b, c in zip(*parts, strict=True)]

    hot = base_urls(len(HOT_CHANNELS))
    urls = base_urls(CHANNELS)
    with_id = rng.integers(0, 10, CHANNELS) > 0
    urls = [f"{u}&channel_id={_reverse32(i)}" if with_id[i] else u for i, u in enumerate(urls)]
    return hot, [f"channel-{i}" for i in range(CHANNELS)], urls


def persons(rng: np.random.Generator, cfg: Config, e: np.ndarray, extra: Extra) -> pa.Table:
    n = e.size
    name = pc.binary_join_element_wise(_pick(FIRST_NAMES, rng.integers(0, 11, n)),
                                       _pick(LAST_NAMES, rng.integers(0, 9, n)), " ")
    email = pc.binary_join_element_wise(next_strings(rng, n, 7), next_strings(rng, n, 5), "@")
    email = pc.binary_join_element_wise(email, pa.scalar(".com"), "")
    cards = np.char.zfill(rng.integers(0, 10_000, (4, n)).astype(str), 4)
    card = pa.array([" ".join(c) for c in zip(*cards, strict=True)] if n else [], pa.string())
    city, state = _pick(CITIES, rng.integers(0, 10, n)), _pick(STATES, rng.integers(0, 6, n))
    size = (8 + pc.utf8_length(name).to_numpy(zero_copy_only=False)
            + pc.utf8_length(email).to_numpy(zero_copy_only=False) + 19
            + pc.utf8_length(city).to_numpy(zero_copy_only=False) + 2)
    return pa.table({
        "id": pa.array(last_person(e) + FIRST_PERSON_ID), "name": name, "email_address": email,
        "credit_card": card, "city": city, "state": state,
        "date_time": pa.array(timestamp_ms(cfg, e), TS),
        "extra": extra(rng, size, AVG_BYTES["person"])})


def auctions(rng: np.random.Generator, cfg: Config, e: np.ndarray, extra: Extra) -> pa.Table:
    n = e.size
    hot = rng.integers(0, 4, n) > 0
    seller = np.where(hot, last_person(e) // HOT_RATIO * HOT_RATIO, next_person(rng, e))
    ts = timestamp_ms(cfg, e)
    horizon = timestamp_ms(cfg, e + NUM_IN_FLIGHT_AUCTIONS * TOTAL // AUCTION) - ts
    expires = ts + 1 + (rng.random(n) * np.maximum(horizon * 2, 1)).astype(np.int64)
    initial = next_price(rng, n)
    item, description = next_strings(rng, n, 20), next_strings(rng, n, 100)
    size = (8 + pc.utf8_length(item).to_numpy(zero_copy_only=False)
            + pc.utf8_length(description).to_numpy(zero_copy_only=False) + 40)
    return pa.table({
        "id": pa.array(last_auction(e) + FIRST_AUCTION_ID), "item_name": item,
        "description": description, "initial_bid": pa.array(initial),
        "reserve": pa.array(initial + next_price(rng, n)), "date_time": pa.array(ts, TS),
        "expires": pa.array(expires, TS), "seller": pa.array(seller + FIRST_PERSON_ID),
        "category": pa.array(FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, n)),
        "extra": extra(rng, size, AVG_BYTES["auction"])})


def bids(rng: np.random.Generator, cfg: Config, e: np.ndarray, extra: Extra,
         channels: tuple[list[str], list[str], list[str]]) -> pa.Table:
    n = e.size
    hot_auction = rng.integers(0, 2, n) > 0
    auction = np.where(hot_auction, last_auction(e) // HOT_RATIO * HOT_RATIO,
                       next_auction(rng, e))
    hot_bidder = rng.integers(0, 4, n) > 0
    bidder = np.where(hot_bidder, last_person(e) // HOT_RATIO * HOT_RATIO + 1,
                      next_person(rng, e))
    price = next_price(rng, n)
    hot_urls, names, urls = channels
    hot_channel = rng.integers(0, 2, n) > 0
    which = np.where(hot_channel, rng.integers(0, len(HOT_CHANNELS), n),
                     len(HOT_CHANNELS) + rng.integers(0, CHANNELS, n))
    return pa.table({
        "auction": pa.array(auction + FIRST_AUCTION_ID),
        "bidder": pa.array(bidder + FIRST_PERSON_ID), "price": pa.array(price),
        "channel": pc.take(pa.array([*HOT_CHANNELS, *names]), pa.array(which)),
        "url": pc.take(pa.array([*hot_urls, *urls]), pa.array(which)),
        "date_time": pa.array(timestamp_ms(cfg, e), TS),
        "extra": extra(rng, np.full(n, 32), AVG_BYTES["bid"])})


def generate(cfg: Config) -> dict[str, pa.Table]:
    """Every event of the configuration, one table per kind, each in emission order."""
    rng = np.random.default_rng(cfg.seed)
    extra = Extra(rng)
    channels = channel_table(rng)
    e = adjusted(np.arange(cfg.events, dtype=np.int64), cfg.disorder_events)
    kind = e % TOTAL
    return {"person": persons(rng, cfg, e[kind < PERSON], extra),
            "auction": auctions(rng, cfg, e[(kind >= PERSON) & (kind < PERSON + AUCTION)],
                                extra),
            "bid": bids(rng, cfg, e[kind >= PERSON + AUCTION], extra, channels)}


def write(cfg: Config, root: Path) -> dict[str, int]:
    """Generate and write the events (and Q13's side input) under `root`; rows per kind."""
    tables = generate(cfg)
    e = adjusted(np.arange(cfg.events, dtype=np.int64), cfg.disorder_events)
    kind = e % TOTAL
    bounds = np.linspace(0, cfg.events, cfg.files + 1).astype(np.int64)
    masks = {"person": kind < PERSON, "auction": (kind >= PERSON) & (kind < PERSON + AUCTION),
             "bid": kind >= PERSON + AUCTION}
    for name, table in tables.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        # file i of every kind holds the events emitted in [bounds[i], bounds[i + 1])
        cuts = np.concatenate([[0], np.cumsum(masks[name])])[bounds]
        for i in range(cfg.files):
            pq.write_table(table.slice(int(cuts[i]), int(cuts[i + 1] - cuts[i])),
                           root / name / f"part-{i:04d}.parquet")
    (root / "side_input").mkdir(parents=True, exist_ok=True)
    keys = np.arange(SIDE_INPUT_ROWS, dtype=np.int64)
    pq.write_table(pa.table({"key": pa.array(keys), "value": pa.array(keys.astype(str))}),
                   root / "side_input" / "part-0000.parquet")
    return {name: t.num_rows for name, t in tables.items()}


def read(root: Path, kind: str) -> pa.Table:
    """One kind's rows in emission order, with `_seq`, their position in it (arrival)."""
    parts = [pq.read_table(p) for p in sorted((root / kind).glob("part-*.parquet"))]
    table = pa.concat_tables(parts)
    return table.append_column("_seq", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--events", type=int, default=Config.events)
    parser.add_argument("--rate", type=int, default=Config.rate)
    parser.add_argument("--disorder-events", type=int, default=Config.disorder_events)
    parser.add_argument("--files", type=int, default=Config.files)
    parser.add_argument("--seed", type=int, default=Config.seed)
    args = parser.parse_args(argv)
    cfg = Config(args.events, args.rate, args.disorder_events, args.files, args.seed)
    counts = write(cfg, args.out)
    print(f"{cfg.events:,} events in {args.out}: {counts}, disorder < {cfg.disorder_ms:g} ms")


if __name__ == "__main__":
    main()
