//! Proves that the real libtorch links and loads: one forward/backward/update step of a tiny linear model
//! on the CPU, checked against the gradient computed by hand.
use tch::{nn, nn::Module, Device, Kind, Tensor};

#[test]
fn forward_backward_step_on_cpu() {
    let vs = nn::VarStore::new(Device::Cpu);
    let mut linear = nn::linear(vs.root(), 3, 1, Default::default());
    tch::no_grad(|| {
        linear.ws.copy_(&Tensor::from_slice(&[1.0f32, -2.0, 0.5]).view([1, 3]));
        let _ = linear.bs.as_mut().unwrap().fill_(0.25);
    });
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).view([2, 3]);
    let target = Tensor::from_slice(&[0.0f32, 1.0]).view([2, 1]);

    let prediction = linear.forward(&x);
    // rows: 1 - 4 + 1.5 + 0.25 = -1.25 ; 4 - 10 + 3 + 0.25 = -2.75
    assert_eq!(Vec::<f32>::try_from(prediction.view([-1])).unwrap(), vec![-1.25, -2.75]);
    let loss = (&prediction - &target).square().mean(Kind::Float);
    loss.backward();

    // d loss / d w = mean over rows of 2 * (pred - target) * x
    let grad: Vec<f32> = Vec::try_from(linear.ws.grad().view([-1])).unwrap();
    let r = [2.0 * (-1.25 - 0.0), 2.0 * (-2.75 - 1.0)];
    let expected: Vec<f32> = (0..3).map(|j| (r[0] * [1.0, 2.0, 3.0][j] + r[1] * [4.0, 5.0, 6.0][j]) / 2.0).collect();
    for (g, e) in grad.iter().zip(&expected) {
        assert!((g - e).abs() < 1e-5, "grad {grad:?} != expected {expected:?}");
    }

    let step = linear.ws.grad() * 0.1;
    tch::no_grad(|| {
        let _ = linear.ws.f_sub_(&step).unwrap();
    });
    let after: Vec<f32> = Vec::try_from(linear.ws.view([-1])).unwrap();
    assert!((after[0] - (1.0 - 0.1 * expected[0])).abs() < 1e-5);
}
