// AudioWorklet processor "pcm16-capture": the microphone's first channel resampled to processorOptions.rate (a
// moving average over one output sample's span against aliasing, then linear interpolation) and posted as
// little-endian pcm16 ArrayBuffers of processorOptions.chunkMs each.

class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const {rate, chunkMs} = options.processorOptions;
    this.step = sampleRate / rate; // input samples per output sample (`sampleRate`: the context's, a global)
    this.position = 0; // of the next output sample, in input samples from the block's start (-1: `last`)
    this.last = 0; // the previous block's final sample
    this.chunk = new Int16Array(Math.max(1, Math.round(rate * chunkMs / 1000)));
    this.filled = 0;
    this.window = new Float32Array(Math.max(1, Math.round(this.step))); // the moving average's last inputs
    this.sum = 0;
    this.next = 0;
  }

  smooth(input) {
    if (this.window.length === 1) return input;
    const output = new Float32Array(input.length);
    for (let i = 0; i < input.length; i++) {
      this.sum += input[i] - this.window[this.next];
      this.window[this.next] = input[i];
      this.next = (this.next + 1) % this.window.length;
      output[i] = this.sum / this.window.length;
    }
    return output;
  }

  push(value) {
    const clipped = Math.max(-1, Math.min(1, value));
    this.chunk[this.filled++] = Math.round(clipped * 32767);
    if (this.filled === this.chunk.length) {
      const copy = this.chunk.slice();
      this.port.postMessage(copy.buffer, [copy.buffer]);
      this.filled = 0;
    }
  }

  process(inputs) {
    if (!inputs[0] || !inputs[0][0] || !inputs[0][0].length) return true;
    const input = this.smooth(inputs[0][0]);
    let position = this.position;
    while (position < input.length - 1) {
      const index = Math.floor(position);
      const fraction = position - index;
      const before = index < 0 ? this.last : input[index];
      this.push(before + (input[index + 1] - before) * fraction);
      position += this.step;
    }
    this.position = position - input.length;
    this.last = input[input.length - 1];
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
