python3 - <<'PY'
import configparser
c = configparser.ConfigParser()
c.read('config.ini')
open('port.txt', 'w').write(c['server']['port'] + '\n')
open('host.txt', 'w').write(c['server']['host'] + '\n')
PY
