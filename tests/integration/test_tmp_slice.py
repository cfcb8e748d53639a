import orjson, time
from materializer.config import parse_config
from materializer.pipeline.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest

def test_slice(spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path):
    topic = new_topic(2)
    cfg = parse_config({"kafka": {"bootstrap_servers": kafka_bootstrap}, "redis": {"url": redis_url},
        "delta": {"root": str(tmp_path/"wh")}, "spark": {"checkpoint_root": str(tmp_path/"cp")},
        "maps": {"users": {"source": {"topics": [topic], "schema": "id STRING, name STRING, age INT"}, "key": "id"}}})
    recs = [(f"u{i%7}".encode(), orjson.dumps({"id": f"u{i%7}", "name": f"n{i}", "age": i})) for i in range(50)]
    recs += [(b"u1", None), (None, b"garbage"), (b"x", b'{"name":"nokey"}')]
    pos = produce(kafka_bootstrap, topic, recs)
    t=time.time()
    q = start_map(spark, cfg, "users")
    q.process_all_available()
    print("took", time.time()-t)
    q.stop()
    ref = fold_latest([(p,o,k,v) for (p,o),(k,v) in zip(pos, recs)], "id", ["id","name","age"])
    got = {k.decode().split(":",1)[1]: orjson.loads(redis_client.get(k)) for k in redis_client.keys("users:u*")}
    assert got == ref
    print(redis_client.hgetall("users:__meta__"))
    df = spark.read.format("delta").load(str(tmp_path/"wh"/"users"))
    df.show()
