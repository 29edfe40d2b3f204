#!/bin/sh
# Regenerates docs/images/shapes_*.png (the README's pictures) with Kiln's CLI from models/kiln-shapes-64.
# Usage: tools/train_tiny_flux/readme_images.sh [path/to/kiln]   (default: build/kiln)
set -e
cd "$(dirname "$0")/../.."
KILN=${1:-build/kiln}
gen() {
  "$KILN" generate --model models/kiln-shapes-64 --prompt "$2" --height 64 --width 64 --steps 4 --guidance 0 \
    --max-sequence-length 40 --seed 0 --dtype f32 --output "docs/images/$1.png"
}
mkdir -p docs/images
gen shapes_default "a big yellow triangle at the top, on a blue background"
gen shapes_white_circle "a big white circle on the right, on a black background"
gen shapes_red_square "a small red square in the center, on an orange background"
gen shapes_blue_square "a big blue square on the right, on a yellow background"
