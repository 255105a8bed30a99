from pathlib import Path


def test_upper():
    assert Path('upper.txt').read_text().split() == ['GRACE', 'ADA', 'LINUS']
