"""The 23 Nexmark queries (Q0-Q22 of the Flink suite): for each, its streamer pipeline (or
why it is pending), its batch oracle in Spark SQL, and how Spark Structured Streaming runs it.

The oracle is the query's exact final answer, in Spark batch SQL over the views `person`,
`auction`, `bid` (each with `_seq`, its position in emission order, which breaks ties the way
arrival does) and `side_input`. Where Flink's SQL runs as is in Spark, it is written as
Flink wrote it (`count(*) filter (where ...)`, `row_number() over (...)`).

Spark Structured Streaming runs the same SQL over streaming views of the same files (or
`sss_sql` where a streaming form differs), with a 4-second watermark on `date_time`; a query
that SSS refuses to start is reported with Spark's own reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines" / "nexmark"

RANKS = """
     count(*) filter (where price < 10000) AS rank1_bids,
     count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
     count(*) filter (where price >= 1000000) AS rank3_bids"""
DISTINCT = """,
     count(distinct bidder) AS total_bidders,
     count(distinct bidder) filter (where price < 10000) AS rank1_bidders,
     count(distinct bidder) filter (where price >= 10000 and price < 1000000) AS rank2_bidders,
     count(distinct bidder) filter (where price >= 1000000) AS rank3_bidders,
     count(distinct auction) AS total_auctions,
     count(distinct auction) filter (where price < 10000) AS rank1_auctions,
     count(distinct auction) filter (where price >= 10000 and price < 1000000)
       AS rank2_auctions,
     count(distinct auction) filter (where price >= 1000000) AS rank3_auctions"""
WINNERS = """
    SELECT A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time, A.expires,
           A.seller, A.category, A.extra, B.auction, B.bidder, B.price,
           B.date_time AS bid_date_time, B.extra AS bid_extra,
           row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC,
                              B._seq ASC) AS rownum
    FROM auction A JOIN bid B
      ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires"""
CHANNEL_ID = """
    CASE WHEN lower(channel) = 'apple' THEN '0'
         WHEN lower(channel) = 'google' THEN '1'
         WHEN lower(channel) = 'facebook' THEN '2'
         WHEN lower(channel) = 'baidu' THEN '3'
         ELSE nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '') END"""


@dataclass(frozen=True)
class Query:
    name: str  # q0 ... q22
    title: str
    kinds: tuple[str, ...]  # the event kinds it reads
    oracle: str
    #: The pipeline's file stem in pipelines/nexmark (pending/ when `pending` says why).
    stem: str
    pending: str = ""
    #: The output is an update stream: its answer is the last row per these columns.
    keys: tuple[str, ...] = ()
    #: Spark Structured Streaming: the SQL over streaming views (default: the oracle), its
    #: output mode, and why it cannot run the query (then it is not tried).
    sss_sql: str = ""
    sss_mode: str = "append"
    sss_na: str = ""
    #: A windowed query's window end (an expression of its output): SSS's AvailableNow run
    #: emits only the windows its final watermark closed, so the oracle is cut there for SSS.
    window_end: str = ""

    @property
    def path(self) -> Path:
        return PIPELINES / ("pending" if self.pending else "") / f"{self.stem}.yaml"


QUERIES = [
    Query("q0", "pass-through", ("bid",),
          "SELECT auction, bidder, price, date_time, extra FROM bid", "q00_pass_through"),
    Query("q1", "currency conversion", ("bid",),
          "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid",
          "q01_currency_conversion"),
    Query("q2", "selection", ("bid",),
          "SELECT auction, price FROM bid WHERE auction % 123 = 0", "q02_selection"),
    Query("q3", "local item suggestion", ("person", "auction"), """
    SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
    WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
          "q03_local_item_suggestion"),
    Query("q4", "average price for a category", ("auction", "bid"), f"""
    SELECT category, avg(price) AS avg_price FROM ({WINNERS}) WHERE rownum = 1
    GROUP BY category""", "q04_average_price_for_category", keys=("category",),
          sss_na="multiple aggregations in update mode; row_number over a stream"),
    Query("q5", "hot items", ("bid",), """
    WITH counts AS (
      SELECT auction, count(*) AS num, window.start AS starttime, window.end AS endtime
      FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds'))
    SELECT C.auction, C.num FROM counts C JOIN (
      SELECT max(num) AS maxn, starttime, endtime FROM counts GROUP BY starttime, endtime) M
    ON C.starttime = M.starttime AND C.endtime = M.endtime AND C.num >= M.maxn""",
          "q05_hot_items"),
    Query("q6", "average selling price by seller", ("auction", "bid"), f"""
    SELECT seller, avg(price) OVER (PARTITION BY seller ORDER BY expires, _close_seq
                                    ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
    FROM (SELECT *, id AS _close_seq FROM ({WINNERS})) WHERE rownum = 1""",
          "q06_average_selling_price_by_seller",
          sss_na="row_number and OVER windows over a stream"),
    Query("q7", "highest bid", ("bid",), """
    SELECT B.auction, B.price, B.bidder, B.date_time, B.extra FROM bid B JOIN (
      SELECT max(price) AS maxprice, window.end AS date_time FROM bid
      GROUP BY window(date_time, '10 seconds')) B1
    ON B.price = B1.maxprice
    WHERE B.date_time BETWEEN B1.date_time - INTERVAL 10 SECONDS AND B1.date_time""",
          "q07_highest_bid",
          window_end="timestamp_seconds(floor(unix_seconds(date_time) / 10) * 10 + 10)"),
    Query("q8", "monitor new users", ("person", "auction"), """
    SELECT P.id, P.name, P.starttime FROM (
      SELECT id, name, window.start AS starttime, window.end AS endtime FROM person
      GROUP BY id, name, window(date_time, '10 seconds')) P
    JOIN (
      SELECT seller, window.start AS starttime, window.end AS endtime FROM auction
      GROUP BY seller, window(date_time, '10 seconds')) A
    ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
          "q08_monitor_new_users", window_end="starttime + INTERVAL 10 SECONDS"),
    Query("q9", "winning bids", ("auction", "bid"), f"""
    SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller,
           category, extra, auction, bidder, price, bid_date_time, bid_extra
    FROM ({WINNERS}) WHERE rownum = 1""", "q09_winning_bids", keys=("id",),
          sss_na="row_number over a stream (max_by after a stream-stream join needs "
                 "update mode, which such a join does not support)"),
    Query("q10", "log to file system", ("bid",), """
    SELECT auction, bidder, price, date_time, extra, date_format(date_time, 'yyyy-MM-dd') AS dt,
           date_format(date_time, 'HH:mm') AS hm FROM bid""", "q10_log_to_file_system"),
    Query("q11", "user sessions", ("bid",), """
    SELECT bidder, count(*) AS bid_count, session_window.start AS starttime,
           session_window.end AS endtime
    FROM bid GROUP BY bidder, session_window(date_time, '10 seconds')""",
          "q11_user_sessions", window_end="endtime"),
    Query("q12", "processing time windows", ("bid",),
          # the windows depend on when the job runs: the answer is each bidder's total
          "SELECT bidder, count(*) AS bid_count FROM bid GROUP BY bidder",
          "q12_processing_time_windows",
          sss_sql="""
    SELECT bidder, count(*) AS bid_count, window.start AS starttime, window.end AS endtime
    FROM bid GROUP BY bidder, window(current_timestamp(), '10 seconds')""",
          sss_mode="update"),
    Query("q13", "bounded side input join", ("bid",), """
    SELECT B.auction, B.bidder, B.price, B.date_time, S.value
    FROM bid B JOIN side_input S ON B.auction % 10000 = S.key""",
          "q13_bounded_side_input_join"),
    Query("q14", "calculation", ("bid",), """
    SELECT auction, bidder, 0.908 * price AS price,
           CASE WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime'
                WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime'
                ELSE 'otherTime' END AS bid_time_type,
           date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts
    FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""",
          "q14_calculation"),
    Query("q15", "bidding statistics report", ("bid",), f"""
    SELECT date_format(date_time, 'yyyy-MM-dd') AS day, count(*) AS total_bids,{RANKS}{DISTINCT}
    FROM bid GROUP BY date_format(date_time, 'yyyy-MM-dd')""", "q15_bidding_statistics",
          keys=("day",), sss_na="count(distinct) over a stream"),
    Query("q16", "channel statistics report", ("bid",), f"""
    SELECT channel, date_format(date_time, 'yyyy-MM-dd') AS day,
           max(date_format(date_time, 'HH:mm')) AS minute, count(*) AS total_bids,{RANKS}{DISTINCT}
    FROM bid GROUP BY channel, date_format(date_time, 'yyyy-MM-dd')""",
          "q16_channel_statistics", keys=("channel", "day"),
          sss_na="count(distinct) over a stream"),
    Query("q17", "auction statistics report", ("bid",), f"""
    SELECT auction, date_format(date_time, 'yyyy-MM-dd') AS day, count(*) AS total_bids,{RANKS},
           min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price,
           sum(price) AS sum_price
    FROM bid GROUP BY auction, date_format(date_time, 'yyyy-MM-dd')""",
          "q17_auction_statistics", keys=("auction", "day"), sss_mode="update"),
    Query("q18", "find last bid", ("bid",), """
    SELECT auction, bidder, price, channel, url, date_time, extra FROM (
      SELECT *, row_number() OVER (PARTITION BY bidder, auction
                                   ORDER BY date_time DESC, _seq DESC) AS rank_number
      FROM bid) WHERE rank_number <= 1""", "q18_find_last_bid", keys=("bidder", "auction"),
          sss_sql="""
    SELECT auction, bidder, last.price, last.channel, last.url, last.date_time, last.extra
    FROM (SELECT auction, bidder,
                 max_by(struct(price, channel, url, date_time, extra), date_time) AS last
          FROM bid GROUP BY bidder, auction)""", sss_mode="update"),
    Query("q19", "auction top-10 price", ("bid",), """
    SELECT * FROM (
      SELECT auction, bidder, price, channel, url, date_time, extra,
             row_number() OVER (PARTITION BY auction ORDER BY price DESC, date_time, _seq)
               AS rank_number FROM bid)
    WHERE rank_number <= 10""", "q19_auction_top10_price", keys=("auction", "rank_number"),
          sss_na="row_number over a stream"),
    Query("q20", "expand bid with auction", ("auction", "bid"), """
    SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time, B.extra,
           A.item_name, A.description, A.initial_bid, A.reserve,
           A.date_time AS auction_date_time, A.expires, A.seller, A.category,
           A.extra AS auction_extra
    FROM bid B JOIN auction A ON B.auction = A.id WHERE A.category = 10""",
          "q20_expand_bid_with_auction"),
    Query("q21", "add channel id", ("bid",), f"""
    SELECT auction, bidder, price, channel, channel_id FROM (
      SELECT auction, bidder, price, channel, {CHANNEL_ID} AS channel_id FROM bid)
    WHERE channel_id IS NOT NULL""", "q21_add_channel_id"),
    Query("q22", "get URL directories", ("bid",), """
    SELECT auction, bidder, price, channel, get(split(url, '/'), 3) AS dir1,
           get(split(url, '/'), 4) AS dir2, get(split(url, '/'), 5) AS dir3 FROM bid""",
          "q22_url_directories"),
]
BY_NAME = {q.name: q for q in QUERIES}
