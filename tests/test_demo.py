from keras_vit import demo


def test_demo_runs_and_round_trips(capsys):
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "outputs identical = True" in out and "86,567,656" in out
