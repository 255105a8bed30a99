wc -w < story.txt | tr -d ' ' > words.txt
