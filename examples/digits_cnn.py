"""Train a small CNN on scikit-learn's digits with nbdnn.nn (the same as `nbdnn demo`):

    python examples/digits_cnn.py --backend both --epochs 8 --plot loss.png

The network, the training loop and the report live in nbdnn/demo.py."""
from nbdnn.demo import main

if __name__ == "__main__":
    main()
