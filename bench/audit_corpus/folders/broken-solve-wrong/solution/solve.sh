sort names.txt | tr a-z A-Z > upper.txt
