"""Writes the start images the image-to-image tests read, with Pillow's encoders (libjpeg,
libwebp): what a photo from a phone or a browser download looks like to Backpack.

  tests/fixtures/images/start.jpg    64x48 JPEG (quality 90, 4:2:0 chroma), a colour gradient
  tests/fixtures/images/start.webp   the same pixels, lossless WebP
  tests/fixtures/images/start.json   the pixels as RGB bytes, for the lossless comparison

  pip install --target /tmp/pil pillow
  PYTHONPATH=/tmp/pil python3 tests/reference/make_start_images.py
"""

import json
import os

from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "images")
WIDTH, HEIGHT = 64, 48


def pixel(x, y):
    return (x * 4 % 256, y * 5 % 256, (x + y) * 2 % 256)


def main():
    os.makedirs(OUT, exist_ok=True)
    image = Image.new("RGB", (WIDTH, HEIGHT))
    image.putdata([pixel(x, y) for y in range(HEIGHT) for x in range(WIDTH)])
    image.save(os.path.join(OUT, "start.jpg"), quality=90)
    image.save(os.path.join(OUT, "start.webp"), lossless=True)
    rgb = [c for y in range(HEIGHT) for x in range(WIDTH) for c in pixel(x, y)]
    with open(os.path.join(OUT, "start.json"), "w") as f:
        json.dump({"width": WIDTH, "height": HEIGHT, "rgb": rgb}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
