#!/usr/bin/env bash
# Install the headless Chromium and its WebDriver (Debian packages) that the `qkvqa inspect` browser test drives,
# when either is absent. Selenium is pointed at these two files; it never downloads a browser.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "Chromium is not installed and this is not root: apt-get install chromium chromium-driver" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
echo "installed: chromium $(dpkg-query -W -f='${Version}' chromium)"
