from pathlib import Path


def test_host():
    assert Path('host.txt').read_text().strip() == 'db-main.internal'


def test_port():
    assert Path('port.txt').read_text().strip() == '9443'
