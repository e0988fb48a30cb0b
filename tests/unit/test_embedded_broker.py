from pathlib import Path

from kombu import Connection


def connect(folder: Path) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder / "c")}
    return Connection("filesystem://", transport="controlplane.broker:Transport", transport_options=options)


def test_every_message_arrives_once_and_a_file_still_being_written_is_left_alone(tmp_path):
    with connect(tmp_path) as connection:
        queue = connection.SimpleQueue("jobs")
        # What a publisher in the middle of writing leaves: consumers must not take it.
        (tmp_path / "1_writing.jobs.msg.partial").write_bytes(b"")
        for n in range(3):
            queue.put({"n": n})
        assert sorted(p.suffix for p in tmp_path.iterdir() if p.is_file()) == [".msg", ".msg", ".msg", ".partial"]
        # Ordered by the millisecond of publication; within one millisecond in any order.
        assert sorted(queue.get(timeout=1).payload["n"] for _ in range(3)) == [0, 1, 2]
        assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["1_writing.jobs.msg.partial"]
        queue.close()
