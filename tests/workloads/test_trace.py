import pytest

from allocator import InvalidRequest
from workloads.trace import DEFAULT_TRACE, load_trace, parse_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def parse(text: str):
    return parse_trace(text.splitlines(keepends=True), source="t.csv")


def test_bundled_trace_has_every_request_and_attribution():
    trace = load_trace()
    assert len(trace) == 19_366
    assert trace.arrival_s[0] == 0.0
    assert (trace.context >= 1).all() and (trace.generated >= 1).all()
    readme = (DEFAULT_TRACE.parent / "README.md").read_text()
    assert "CC-BY 4.0" in readme and "Splitwise" in readme


def test_timestamps_become_seconds_from_the_first():
    trace = parse(HEADER + "2023-11-16 18:15:46.5000000,10,2\n2023-11-16 18:15:48.0000000,20,3\n")
    assert trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.context.tolist() == [10, 20] and trace.generated.tolist() == [2, 3]


def test_columns_may_come_in_any_order_and_seconds_are_accepted():
    trace = parse("GeneratedTokens,TIMESTAMP,ContextTokens\n5,10.0,7\n6,12.5,8\n")
    assert trace.arrival_s.tolist() == [0.0, 2.5] and trace.context.tolist() == [7, 8]


def test_missing_column_is_named():
    with pytest.raises(InvalidRequest, match=r"line 1: header lacks column\(s\) GeneratedTokens"):
        parse("TIMESTAMP,ContextTokens\n1,2\n")


def test_malformed_line_names_its_number_and_problem():
    text = HEADER + "2023-11-16 18:15:46.0,10,2\n2023-11-16 18:15:47.0,ten,2\n"
    with pytest.raises(InvalidRequest, match=r"t.csv: line 3: ContextTokens 'ten' is not an integer"):
        parse(text)


def test_short_row_and_bad_timestamp_and_zero_tokens_are_rejected():
    with pytest.raises(InvalidRequest, match="line 2: expected 3 columns, found 2"):
        parse(HEADER + "1.0,2\n")
    with pytest.raises(InvalidRequest, match="line 2: timestamp"):
        parse(HEADER + "yesterday,2,3\n")
    with pytest.raises(InvalidRequest, match="line 3: GeneratedTokens 0 is below 1"):
        parse(HEADER + "1.0,2,3\n2.0,2,0\n")


def test_empty_file_and_header_only_are_rejected():
    with pytest.raises(InvalidRequest, match="empty file"):
        parse("")
    with pytest.raises(InvalidRequest, match="no requests"):
        parse(HEADER)


def test_unreadable_path_is_an_invalid_request(tmp_path):
    with pytest.raises(InvalidRequest, match="cannot read trace"):
        load_trace(tmp_path / "nope.csv")


@pytest.mark.parametrize("stamp", ["nan", "inf", "-inf", "1e400"])
def test_non_finite_timestamps_are_rejected_naming_the_line(stamp):
    with pytest.raises(InvalidRequest, match="line 3: timestamp"):
        parse(HEADER + f"1.0,2,3\n{stamp},2,3\n")
