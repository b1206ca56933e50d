from tests.test_suite import *  # noqa


def test_dbg(fake_root):
    sel = cpu_selection()
    a = suite.plan_fingerprint(sel)
    suite.load_plan(sel)
    b = suite.plan_fingerprint(sel)
    import glob

    print(a[:20], b[:20], glob.glob(os.environ["DSKBENCH_CACHE_DIR"] + "/*"))
    assert a == b
