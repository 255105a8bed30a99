from pathlib import Path


def test_count():
    assert Path('words.txt').read_text().strip() == '12'


def test_story_kept():
    assert Path('story.txt').read_text() == 'the quick brown fox\njumps over the lazy dog\nand runs away\n'
